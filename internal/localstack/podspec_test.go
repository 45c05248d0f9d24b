package localstack

import "testing"

func TestRebind(t *testing.T) {
	ports := map[int32]int{8080: 41000, 8081: 41001}
	for _, tc := range []struct{ in, want string }{
		{"--metrics-bind-address=:8080", "--metrics-bind-address=127.0.0.1:41000"},
		{"--health-probe-bind-address=0.0.0.0:8081", "--health-probe-bind-address=127.0.0.1:41001"},
		{":8080", "127.0.0.1:41000"},
		{"--x=[::]:8081", "--x=127.0.0.1:41001"},
		{"--metrics-bind-address=:9090", "--metrics-bind-address=:9090"}, // not a declared port
		{"--nats-url=nats://nats:8080", "--nats-url=nats://nats:8080"},   // not a bind address
		{"--peer=10.0.0.1:8080", "--peer=10.0.0.1:8080"},                 // another host
		{"--metrics-bind-address=0", "--metrics-bind-address=0"},         // disabled
		{"dispatcher", "dispatcher"},
	} {
		if got := rebind(tc.in, ports); got != tc.want {
			t.Errorf("rebind(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"POD_NAME": "web-1", "NS": "shop"}
	for _, tc := range []struct{ in, want string }{
		{"--identity=$(POD_NAME)", "--identity=web-1"},
		{"$(NS)/$(POD_NAME)", "shop/web-1"},
		{"$(UNKNOWN)", "$(UNKNOWN)"},
		{"$$(POD_NAME)", "$(POD_NAME)"},
		{"cost: $5", "cost: $5"},
		{"open $(POD_NAME", "open $(POD_NAME"},
		{"trailing $", "trailing $"},
	} {
		if got := expand(tc.in, vars); got != tc.want {
			t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFieldValue(t *testing.T) {
	meta := podMeta{Name: "p", Namespace: "ns", ServiceAccount: "sa",
		Labels: map[string]string{"app": "a"}, Annotations: map[string]string{"x/y": "z"}}
	for path, want := range map[string]string{
		"metadata.name": "p", "metadata.namespace": "ns", "spec.serviceAccountName": "sa",
		"status.podIP": "127.0.0.1", "metadata.labels['app']": "a", "metadata.annotations['x/y']": "z",
	} {
		if got, err := fieldValue(meta, path); err != nil || got != want {
			t.Errorf("fieldValue(%q) = %q, %v; want %q", path, got, err, want)
		}
	}
	if _, err := fieldValue(meta, "metadata.uid"); err == nil {
		t.Error("an unsupported fieldRef must be refused")
	}
}
