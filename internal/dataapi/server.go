package dataapi

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	registryrest "k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/dataapi/openapi"
	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/version"
)

// Options are the server's flags: serving, delegated authentication and authorization, audit,
// and the kubeconfig it reads endpoints with (in-cluster when empty).
type Options struct {
	ServerRun      *genericoptions.ServerRunOptions
	SecureServing  *genericoptions.SecureServingOptionsWithLoopback
	Authentication *genericoptions.DelegatingAuthenticationOptions
	Authorization  *genericoptions.DelegatingAuthorizationOptions
	Audit          *genericoptions.AuditOptions
	Features       *genericoptions.FeatureOptions
	// Kubeconfig is the file of the Kubernetes API the server reads WebhookEndpoints from, and
	// delegates authentication and authorization to (empty: in-cluster).
	Kubeconfig string
}

// DefaultPort is where the server listens by default (the APIService's Service targets it).
const DefaultPort = 8443

// NewOptions are the defaults.
func NewOptions() *Options {
	o := &Options{
		ServerRun:      genericoptions.NewServerRunOptions(),
		SecureServing:  genericoptions.NewSecureServingOptions().WithLoopback(),
		Authentication: genericoptions.NewDelegatingAuthenticationOptions(),
		Authorization:  genericoptions.NewDelegatingAuthorizationOptions(),
		Audit:          genericoptions.NewAuditOptions(),
		Features:       genericoptions.NewFeatureOptions(),
	}
	o.SecureServing.BindPort = DefaultPort
	o.Authorization.AlwaysAllowPaths = []string{"/healthz", "/readyz", "/livez"}
	return o
}

// AddFlags adds the options' flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.SecureServing.AddFlags(fs)
	o.Authentication.AddFlags(fs)
	o.Authorization.AddFlags(fs)
	o.Audit.AddFlags(fs)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of the Kubernetes API server (in-cluster when empty)")
}

// restConfig is the configuration of the Kubernetes API the server talks to.
func (o *Options) restConfig() (*rest.Config, error) {
	if o.Kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(&clientcmd.ClientConfigLoadingRules{ExplicitPath: o.Kubeconfig},
		&clientcmd.ConfigOverrides{}).ClientConfig()
}

// config is the generic API server's configuration.
func (o *Options) config() (*genericapiserver.Config, error) {
	if o.Kubeconfig != "" {
		if o.Authentication.RemoteKubeConfigFile == "" {
			o.Authentication.RemoteKubeConfigFile = o.Kubeconfig
		}
		if o.Authorization.RemoteKubeConfigFile == "" {
			o.Authorization.RemoteKubeConfigFile = o.Kubeconfig
		}
	}
	if err := o.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
		return nil, fmt.Errorf("creating self-signed serving certificates: %w", err)
	}
	if err := o.ServerRun.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	c := genericapiserver.NewConfig(Codecs)
	if err := o.ServerRun.ApplyTo(c); err != nil {
		return nil, err
	}
	if err := o.SecureServing.ApplyTo(&c.SecureServing, &c.LoopbackClientConfig); err != nil {
		return nil, err
	}
	if err := o.Authentication.ApplyTo(&c.Authentication, c.SecureServing, nil); err != nil {
		return nil, err
	}
	if err := o.Authorization.ApplyTo(&c.Authorization); err != nil {
		return nil, err
	}
	if err := o.Audit.ApplyTo(c); err != nil {
		return nil, err
	}
	namer := openapinamer.NewDefinitionNamer(Scheme)
	c.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(openapi.GetOpenAPIDefinitions, namer)
	c.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(openapi.GetOpenAPIDefinitions, namer)
	c.OpenAPIConfig.Info.Title, c.OpenAPIV3Config.Info.Title = "webhook-operator data API", "webhook-operator data API"
	c.OpenAPIConfig.Info.Version, c.OpenAPIV3Config.Info.Version = version.Version, version.Version
	// No etcd, no admission: nothing is stored here.
	c.EnableMetrics = true
	return c, nil
}

// Server is the API server, ready to run.
type Server struct {
	generic *genericapiserver.GenericAPIServer
	cache   cache.Cache
}

// New builds the server on bus (NATS), reading WebhookEndpoints through an informer cache.
func New(o *Options, bus *Bus) (*Server, error) { return newServer(o, bus, limits{}) }

func newServer(o *Options, bus *Bus, l limits) (*Server, error) {
	c, err := o.config()
	if err != nil {
		return nil, err
	}
	rc, err := o.restConfig()
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	epCache, err := cache.New(rc, cache.Options{Scheme: scheme.New(), ByObject: map[client.Object]cache.ByObject{&v1alpha1.WebhookEndpoint{}: {}}})
	if err != nil {
		return nil, err
	}
	g, err := c.Complete(nil).New("webhook-operator-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, err
	}
	if err := install(g, bus, epCache, l); err != nil {
		return nil, err
	}
	return &Server{generic: g, cache: epCache}, nil
}

// limits override the reader's bounds (tests).
type limits struct {
	maxScan uint64
}

// install installs the API's resources into g.
func install(g *genericapiserver.GenericAPIServer, bus *Bus, endpoints client.Reader, l limits) error {
	info := genericapiserver.NewDefaultAPIGroupInfo(datav1alpha1.GroupName, Scheme, metav1.ParameterCodec, Codecs)
	info.NegotiatedSerializer = withoutProtobuf{Codecs}
	d := &deliveryStorage{bus: bus, endpoints: endpoints, now: time.Now, maxScan: l.maxScan}
	dl := &deadLetterStorage{bus: bus, now: time.Now}
	info.VersionedResourcesStorageMap[datav1alpha1.SchemeGroupVersion.Version] = map[string]registryrest.Storage{
		datav1alpha1.ResourceDeliveries:                                          d,
		datav1alpha1.ResourceDeliveries + "/" + datav1alpha1.SubresourcePayload:  &deliveryPayloadStorage{d: d},
		datav1alpha1.ResourceDeadLetters:                                         dl,
		datav1alpha1.ResourceDeadLetters + "/" + datav1alpha1.SubresourcePayload: &deadLetterPayloadStorage{dl: dl},
		datav1alpha1.ResourceEvents: &eventStorage{bus: bus, now: time.Now, publisher: ingress.NewPublisher(ingress.Options{
			JS: bus.JS, MaxPayload: bus.maxPayload, Names: bus.Streams.Names, MaxEventBytes: bus.MaxEventBytes})},
	}
	return g.InstallAPIGroup(&info)
}

// Run serves until ctx ends; ready is called once it serves (may be nil).
func (s *Server) Run(ctx context.Context) error {
	errs := make(chan error, 2)
	go func() { errs <- s.cache.Start(ctx) }()
	if _, err := s.cache.GetInformer(ctx, &v1alpha1.WebhookEndpoint{}); err != nil {
		return fmt.Errorf("watching WebhookEndpoints: %w", err)
	}
	prepared := s.generic.PrepareRun()
	go func() { errs <- prepared.RunWithContext(ctx) }()
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
		return <-errs
	}
}
