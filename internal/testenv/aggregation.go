package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// frontProxyUser is the common name of the client certificate kube-apiserver proxies
// aggregated requests with, the one --requestheader-allowed-names admits.
const frontProxyUser = "webhook-operator"

// frontProxy makes the aggregation layer's certificates in dir and sets the flags that make
// kube-apiserver its front proxy: request headers trusted from clients of the CA, and the
// client certificate it presents to aggregated servers. Without --enable-aggregator-routing:
// the API server reaches an APIService's Service by its cluster IP or, for an ExternalName
// Service, by that name, which is how a test's own process is reached (EndpointSlices refuse
// loopback addresses).
func frontProxy(env *envtest.Environment, dir string) (*TLSFiles, error) {
	f, err := WriteTLS(dir)
	if err != nil {
		return nil, fmt.Errorf("front-proxy certificates: %w", err)
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("requestheader-client-ca-file", f.CA)
	args.Set("requestheader-allowed-names", frontProxyUser)
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("proxy-client-cert-file", f.ClientCert)
	args.Set("proxy-client-key-file", f.ClientKey)
	return f, nil
}

// APIServiceNamespace holds the Services RegisterAPIService makes.
const APIServiceNamespace = "kube-system"

// APIServiceHost is the name of the Service of an aggregated server RegisterAPIService
// registers, in APIServiceNamespace: its serving certificate must be valid for it
// (WriteTLSFor(dir, APIServiceHost(service))).
func APIServiceHost(service string) string { return service + "." + APIServiceNamespace + ".svc" }

// RegisterAPIService registers group/version with the aggregation layer, served on this
// machine at port by a server whose certificate caPEM signs (valid for
// APIServiceHost(service)), and waits until the API server says it is available.
func (cp *ControlPlane) RegisterAPIService(ctx context.Context, service, group, version string, port int, caPEM []byte) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: APIServiceNamespace, Name: service},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
			Ports: []corev1.ServicePort{{Port: int32(port), TargetPort: intstr.FromInt(port)}}}}
	if err := cp.Client.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	as := &unstructured.Unstructured{}
	as.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"})
	as.SetName(version + "." + group)
	as.Object["spec"] = map[string]any{
		"group": group, "version": version, "groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
		"service":  map[string]any{"namespace": APIServiceNamespace, "name": service, "port": int64(port)},
		"caBundle": caPEM,
	}
	if err := cp.Client.Create(ctx, as); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return Poll(60*time.Second, func() error {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(as.GroupVersionKind())
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: as.GetName()}, got); err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Available" {
				if m["status"] == "True" {
					return nil
				}
				return fmt.Errorf("APIService %s is not available: %v: %v", as.GetName(), m["reason"], m["message"])
			}
		}
		return fmt.Errorf("APIService %s has no Available condition yet", as.GetName())
	})
}

// Kubeconfig writes a kubeconfig of user (who is in groups) for this control plane into dir,
// named after the user, and returns its path: a client certificate the API server trusts.
func (cp *ControlPlane) Kubeconfig(dir, user string, groups ...string) (string, error) {
	u, err := cp.Env.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return "", err
	}
	b, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "kubeconfig-"+user)
	return p, os.WriteFile(p, b, 0o600)
}
