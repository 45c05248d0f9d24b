package localstack

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/webhook-operator/webhook-operator/internal/satoken"
)

// tokenLifetime is how long a requested ServiceAccount token is valid; it is refreshed at 80%
// of that, as the kubelet refreshes projected tokens.
const tokenLifetime = time.Hour

// identity is a ServiceAccount's kubeconfig in a directory, the local stand-in for the token,
// CA and namespace the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount:
// dir/token holds a token from the TokenRequest API, dir/ca.crt the API server's CA, and
// dir/kubeconfig refers to both with tokenFile, which client-go re-reads, so a process that
// runs for hours keeps a valid token while the identity refreshes it.
type identity struct {
	namespace, serviceAccount string
	dir                       string
	kubeconfig                string
	token                     *satoken.File
}

// newIdentity requests a first token for namespace/serviceAccount, writes the kubeconfig into
// dir, and refreshes the token until close. It fails while the ServiceAccount does not exist.
func newIdentity(ctx context.Context, cs kubernetes.Interface, admin *rest.Config, namespace, serviceAccount, dir string, logf func(string, ...any)) (*identity, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	id := &identity{namespace: namespace, serviceAccount: serviceAccount, dir: dir, kubeconfig: filepath.Join(dir, "kubeconfig")}
	t, err := satoken.Start(ctx, cs, namespace, serviceAccount, nil, tokenLifetime, filepath.Join(dir, "token"), logf)
	if err != nil {
		return nil, err
	}
	id.token = t
	if err := id.writeKubeconfig(admin); err != nil {
		t.Close()
		return nil, err
	}
	return id, nil
}

func (id *identity) writeKubeconfig(admin *rest.Config) error {
	ca := filepath.Join(id.dir, "ca.crt")
	if err := satoken.WriteFileAtomic(ca, admin.CAData, 0o600); err != nil {
		return err
	}
	user := "system:serviceaccount:" + id.namespace + ":" + id.serviceAccount
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: admin.Host, CertificateAuthority: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{TokenFile: filepath.Join(id.dir, "token")}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user, Namespace: id.namespace}
	cfg.CurrentContext = "local"
	return clientcmd.WriteToFile(*cfg, id.kubeconfig)
}

// close stops refreshing the token.
func (id *identity) close() {
	if id.token != nil {
		id.token.Close()
	}
}
