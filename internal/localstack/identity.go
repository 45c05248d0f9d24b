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

// tokenFile is a ServiceAccount token from the TokenRequest API kept fresh in a file, as the
// kubelet keeps a projected token: refreshed at 80% of its lifetime, replaced atomically.
type tokenFile struct {
	namespace, serviceAccount string
	audiences                 []string
	seconds                   int64
	path                      string
	cs                        kubernetes.Interface
	cancel                    context.CancelFunc
	done                      chan struct{}
}

// startTokenFile writes a first token of namespace/serviceAccount for audiences (nil: the API
// server's own) valid for seconds to path, and refreshes it until close. It fails while the
// ServiceAccount does not exist.
func startTokenFile(ctx context.Context, cs kubernetes.Interface, namespace, serviceAccount string, audiences []string, seconds int64, path string, logf func(string, ...any)) (*tokenFile, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	t := &tokenFile{namespace: namespace, serviceAccount: serviceAccount, audiences: audiences, seconds: seconds,
		path: path, cs: cs, done: make(chan struct{})}
	expires, err := t.refresh(ctx)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	go func() {
		defer close(t.done)
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
			e, err := t.refresh(rctx)
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
	return t, nil
}

// refresh requests a token and replaces the file atomically.
func (t *tokenFile) refresh(ctx context.Context) (time.Time, error) {
	seconds := t.seconds
	tr, err := t.cs.CoreV1().ServiceAccounts(t.namespace).CreateToken(ctx, t.serviceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: t.audiences, ExpirationSeconds: &seconds}},
		metav1.CreateOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", t.namespace, t.serviceAccount, err)
	}
	if err := writeFileAtomic(t.path, []byte(tr.Status.Token), 0o600); err != nil {
		return time.Time{}, err
	}
	return tr.Status.ExpirationTimestamp.Time, nil
}

// close stops refreshing the token.
func (t *tokenFile) close() {
	if t.cancel != nil {
		t.cancel()
		<-t.done
	}
}

// identity is a ServiceAccount's kubeconfig in a directory, the local stand-in for the token,
// CA and namespace the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount:
// dir/token holds a token from the TokenRequest API, dir/ca.crt the API server's CA, and
// dir/kubeconfig refers to both with tokenFile, which client-go re-reads, so a process that
// runs for hours keeps a valid token while the identity refreshes it.
type identity struct {
	namespace, serviceAccount string
	dir                       string
	kubeconfig                string
	token                     *tokenFile
}

// newIdentity requests a first token for namespace/serviceAccount, writes the kubeconfig into
// dir, and refreshes the token until close. It fails while the ServiceAccount does not exist.
func newIdentity(ctx context.Context, cs kubernetes.Interface, admin *rest.Config, namespace, serviceAccount, dir string, logf func(string, ...any)) (*identity, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	id := &identity{namespace: namespace, serviceAccount: serviceAccount, dir: dir, kubeconfig: filepath.Join(dir, "kubeconfig")}
	t, err := startTokenFile(ctx, cs, namespace, serviceAccount, nil, int64(tokenLifetime/time.Second), filepath.Join(dir, "token"), logf)
	if err != nil {
		return nil, err
	}
	id.token = t
	if err := id.writeKubeconfig(admin); err != nil {
		t.close()
		return nil, err
	}
	return id, nil
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
	if id.token != nil {
		id.token.close()
	}
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
