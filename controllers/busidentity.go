package controllers

import (
	"context"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// BusAuth says how dispatchers prove who they are to NATS.
type BusAuth struct {
	// Callout: each dispatcher connects with a projected token of its own ServiceAccount
	// (audience Audience) through the auth callout the controller serves, and gets its
	// namespace's permissions only. The mirrored NATS Secret then carries TLS material only,
	// never a credential.
	Callout bool
	// Audience of the projected token (natsauth.DefaultAudience).
	Audience string
	// TokenSeconds is the projected token's lifetime; the kubelet renews it at 80%.
	TokenSeconds int64
}

// Where a dispatcher's projected NATS token is mounted.
const (
	natsTokenDir  = "/var/run/secrets/" + natsauth.DefaultAudience
	natsTokenFile = natsTokenDir + "/token"
	// defaultTokenSeconds is the kubelet's default for projected tokens.
	defaultTokenSeconds = 3600
)

// tlsKeys are the keys of the NATS Secret that are TLS material, not credentials: in callout
// mode they are all that is mirrored into dispatcher namespaces.
var tlsKeys = []string{"ca.crt", "tls.crt", "tls.key"}

// mirroredKeys keeps of a NATS Secret what dispatchers may get: in callout mode only TLS
// material, so that nothing in a tenant namespace is worth more than that namespace.
func (a BusAuth) mirroredKeys(data map[string][]byte) map[string][]byte {
	if !a.Callout {
		return data
	}
	out := map[string][]byte{}
	for _, k := range tlsKeys {
		if v, ok := data[k]; ok {
			out[k] = v
		}
	}
	return out
}

// tokenVolume is the projected ServiceAccount token a dispatcher connects to NATS with.
func (a BusAuth) tokenVolume() *corev1ac.VolumeApplyConfiguration {
	aud := a.Audience
	if aud == "" {
		aud = natsauth.DefaultAudience
	}
	seconds := a.TokenSeconds
	if seconds <= 0 {
		seconds = defaultTokenSeconds
	}
	return corev1ac.Volume().WithName("nats-token").WithProjected(corev1ac.ProjectedVolumeSource().
		WithSources(corev1ac.VolumeProjection().WithServiceAccountToken(corev1ac.ServiceAccountTokenProjection().
			WithAudience(aud).WithExpirationSeconds(seconds).WithPath("token"))))
}

// DispatcherServiceAccounts recognises, for the auth callout, the ServiceAccounts the
// controller made for dispatchers: labelled as its own (the cache holds no other), named as a
// dispatcher, and for a dedicated one the endpoint it serves; with its UID, which the token's
// identity must have.
func DispatcherServiceAccounts(r client.Reader) natsauth.DispatcherLookup {
	return func(ctx context.Context, namespace, name string) (natsauth.DispatcherAccount, bool, error) {
		var none natsauth.DispatcherAccount
		sa := &corev1.ServiceAccount{}
		if err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, sa); err != nil {
			if apierrors.IsNotFound(err) {
				return none, false, nil
			}
			return none, false, err
		}
		if sa.Labels[names.LabelName] != names.LabelNameValue || sa.Labels[names.LabelManagedBy] != names.LabelManagedByValue || sa.Labels[names.LabelDispatcher] != name {
			return none, false, nil
		}
		ep := sa.Annotations[names.AnnotationEndpoint]
		if ep == "" && name != names.SharedDispatcher || ep != "" && name != names.DedicatedDispatcher(ep) {
			return none, false, nil
		}
		return natsauth.DispatcherAccount{Endpoint: ep, UID: string(sa.UID)}, true, nil
	}
}

// tokenArgs are the flags of a dispatcher in callout mode.
func (a BusAuth) tokenArgs() []string {
	if !a.Callout {
		return nil
	}
	return []string{"--nats-token-file=" + natsTokenFile}
}

// SourceConsumers says, for the auth callout, what a dispatcher reads on source namespaces'
// events streams: for each endpoint it serves that reads source namespaces (a dedicated
// dispatcher serves its endpoint, the shared one every other), its consumer on the events
// stream of each source namespace that consents now (none unless allow, the installation's
// --allow-cross-namespace-sources), oldest endpoint first. A dispatcher that finds a new such
// endpoint reconnects, and so asks again.
func SourceConsumers(r client.Reader, names streams.Names, allow bool) natsauth.SourceConsumerLookup {
	return func(ctx context.Context, namespace, dedicated string) ([]natsauth.SourceConsumer, error) {
		if !allow {
			return nil, nil
		}
		var list v1alpha1.WebhookEndpointList
		if err := r.List(ctx, &list, client.InNamespace(namespace)); err != nil {
			return nil, err
		}
		eps := make([]*v1alpha1.WebhookEndpoint, 0, len(list.Items))
		for i := range list.Items {
			ep := &list.Items[i]
			isDedicated := ep.Spec.Dispatcher != nil && ep.Spec.Dispatcher.Dedicated
			if len(ep.Spec.SourceNamespaces) == 0 || dedicated != "" && ep.Name != dedicated || dedicated == "" && isDedicated {
				continue
			}
			eps = append(eps, ep)
		}
		// The oldest first: an endpoint created later never pushes an earlier one out of a
		// grant that cannot hold them all.
		slices.SortFunc(eps, func(a, b *v1alpha1.WebhookEndpoint) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		})
		var out []natsauth.SourceConsumer
		consents := map[string]bool{} // per source namespace, asked once
		consenting := func(src string) (bool, error) {
			ok, seen := consents[src]
			if !seen {
				why, err := sourceRefusal(ctx, r, namespace, src)
				if err != nil {
					return false, err
				}
				ok = why == ""
				consents[src] = ok
			}
			return ok && src != namespace, nil
		}
		// The shared lane's intake consumer on each consenting source first (one per source,
		// whatever the number of endpoints), then each endpoint's own consumers: those of its
		// own lane, and those a shared-lane endpoint still drains.
		intake := map[string]bool{}
		for _, ep := range eps {
			if dedicated != "" || streams.LaneOf(&ep.Spec) != streams.LaneShared {
				continue
			}
			for _, src := range ep.Spec.SourceNamespaces {
				ok, err := consenting(src)
				if err != nil {
					return nil, err
				}
				if ok && !intake[src] {
					intake[src] = true
					out = append(out, natsauth.SourceConsumer{Stream: names.For(src).EventsStream(), Consumer: streams.IntakeConsumer(namespace)})
				}
			}
		}
		for _, ep := range eps {
			consumer := streams.EndpointConsumerOf(namespace, ep.Name)
			shared := dedicated == "" && streams.LaneOf(&ep.Spec) == streams.LaneShared
			for _, src := range ep.Spec.SourceNamespaces {
				ok, err := consenting(src)
				if err != nil {
					return nil, err
				}
				stream := names.For(src).EventsStream()
				if ok && (!shared || slices.Contains(ep.Status.DrainingConsumers, stream+"/"+consumer)) {
					out = append(out, natsauth.SourceConsumer{Stream: stream, Consumer: consumer})
				}
			}
		}
		return out, nil
	}
}
