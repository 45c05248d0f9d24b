package faults

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// takeOverNATS stops the stack's embedded server and starts nats-server as a process of its
// own on the same port and file storage, so that every URL the stack handed out keeps working:
// stopping and starting it again is a real server restart that every client (the controller,
// the dispatchers, the plugin and the producers) has to live through.
func takeOverNATS(s *localstack.Stack, binary, logDir string, logf func(string, ...any)) (*testenv.NATSProcess, error) {
	port, store := s.NATS.Port, s.NATS.StoreDir
	conf := filepath.Join(filepath.Dir(store), "nats-server.conf")
	// The limits of the embedded server (internal/testenv).
	text := fmt.Sprintf(`listen: "127.0.0.1:%d"
max_payload: 8MB
jetstream {
  store_dir: %q
  max_memory_store: 1GB
  max_file_store: 8GB
}
`, port, store)
	// The stack's auth-callout configuration, as an installation's nats-server has it.
	text += s.Auth.Config.Render()
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return nil, err
	}
	n := &testenv.NATSProcess{Name: "nats-server", Binary: binary, Config: conf, LogPath: filepath.Join(logDir, "nats-server.log"),
		Port: port, StoreDir: store, Logf: logf, Admin: testenv.NATSAdminOptions(s.Auth)}
	s.NATS.Stop()
	logf("embedded NATS stopped; nats-server takes over port %d and storage %s", port, store)
	return n, n.Start()
}
