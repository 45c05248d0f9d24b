// Package satoken keeps a ServiceAccount token from the TokenRequest API fresh in a file, as
// the kubelet keeps a projected token: requested for some audiences and a lifetime, refreshed
// at 80% of it, replaced atomically. client-go (a kubeconfig's tokenFile, rest.Config's
// BearerTokenFile) and the NATS connection (opconfig's token file) read the file again when
// they need it, so a process that runs for days keeps a valid token.
//
// The local stack uses it for the processes it runs as pods, and a shared dispatcher for the
// identity of each namespace it serves.
package satoken

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// File is a ServiceAccount's token kept fresh in a file until Close.
type File struct {
	namespace, serviceAccount string
	audiences                 []string
	seconds                   int64
	path                      string
	cs                        kubernetes.Interface
	cancel                    context.CancelFunc
	done                      chan struct{}
}

// Start writes a first token of namespace/serviceAccount for audiences (nil: the API server's
// own) valid for lifetime to path, and refreshes it until Close; logf is told of a refresh that
// failed (it is tried again 5 s later). It fails while the ServiceAccount does not exist or the
// caller may not create its tokens.
func Start(ctx context.Context, cs kubernetes.Interface, namespace, serviceAccount string, audiences []string, lifetime time.Duration, path string, logf func(string, ...any)) (*File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	t := &File{namespace: namespace, serviceAccount: serviceAccount, audiences: audiences, seconds: int64(lifetime / time.Second),
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
			wait := max(time.Until(expires)*4/5, time.Second)
			timer := time.NewTimer(wait)
			select {
			case <-rctx.Done():
				timer.Stop()
				return
			case <-timer.C:
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

// Refresh requests a new token now (a container's restart wrote its volumes again).
func (t *File) Refresh(ctx context.Context) error {
	_, err := t.refresh(ctx)
	return err
}

// Path is the token's file.
func (t *File) Path() string { return t.path }

// refresh requests a token and replaces the file atomically.
func (t *File) refresh(ctx context.Context) (time.Time, error) {
	seconds := t.seconds
	tr, err := t.cs.CoreV1().ServiceAccounts(t.namespace).CreateToken(ctx, t.serviceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: t.audiences, ExpirationSeconds: &seconds}},
		metav1.CreateOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", t.namespace, t.serviceAccount, err)
	}
	if err := WriteFileAtomic(t.path, []byte(tr.Status.Token), 0o600); err != nil {
		return time.Time{}, err
	}
	return tr.Status.ExpirationTimestamp.Time, nil
}

// Close stops refreshing the token; the file stays.
func (t *File) Close() {
	if t.cancel != nil {
		t.cancel()
		<-t.done
	}
}

// WriteFileAtomic replaces path with data: a reader sees the old content or the new, never a
// part.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
