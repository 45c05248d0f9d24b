package localstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
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
	cs                        kubernetes.Interface
	cancel                    context.CancelFunc
	done                      chan struct{}
}

// newIdentity requests a first token for namespace/serviceAccount, writes the kubeconfig into
// dir, and refreshes the token until close. It fails while the ServiceAccount does not exist.
func newIdentity(ctx context.Context, cs kubernetes.Interface, admin *rest.Config, namespace, serviceAccount, dir string, logf func(string, ...any)) (*identity, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	id := &identity{namespace: namespace, serviceAccount: serviceAccount, dir: dir,
		kubeconfig: filepath.Join(dir, "kubeconfig"), cs: cs, done: make(chan struct{})}
	expires, err := id.refresh(ctx)
	if err != nil {
		return nil, err
	}
	if err := id.writeKubeconfig(admin); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	id.cancel = cancel
	go func() {
		defer close(id.done)
		for {
			wait := time.Until(expires) * 4 / 5
			if wait < time.Second {
				wait = time.Second
			}
			select {
			case <-rctx.Done():
				return
			case <-time.After(wait):
			}
			e, err := id.refresh(rctx)
			if err != nil {
				if rctx.Err() == nil {
					logf("refreshing the token of ServiceAccount %s/%s: %v", namespace, serviceAccount, err)
				}
				expires = time.Now().Add(5 * time.Second)
				continue
			}
			expires = e
		}
	}()
	return id, nil
}

// refresh requests a token and replaces dir/token atomically.
func (id *identity) refresh(ctx context.Context) (time.Time, error) {
	seconds := int64(tokenLifetime / time.Second)
	tr, err := id.cs.CoreV1().ServiceAccounts(id.namespace).CreateToken(ctx, id.serviceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}},
		metav1.CreateOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", id.namespace, id.serviceAccount, err)
	}
	if err := writeFileAtomic(filepath.Join(id.dir, "token"), []byte(tr.Status.Token), 0o600); err != nil {
		return time.Time{}, err
	}
	return tr.Status.ExpirationTimestamp.Time, nil
}

func (id *identity) writeKubeconfig(admin *rest.Config) error {
	ca := filepath.Join(id.dir, "ca.crt")
	if err := writeFileAtomic(ca, admin.CAData, 0o600); err != nil {
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
	if id.cancel != nil {
		id.cancel()
		<-id.done
	}
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
