package plugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/version"
)

// The plugin reads deliveries and dead letters, and purges dead letters, through the data API
// (data.webhook-operator.io/v1alpha1, served by `webhook-operator apiserver` behind the
// aggregation layer): the Kubernetes API's authentication and RBAC decide, and no command that
// reads opens a NATS connection.

// APIServiceName is the APIService that registers the data API.
var APIServiceName = datav1alpha1.SchemeGroupVersion.Version + "." + datav1alpha1.GroupName

// dataCallTimeout bounds one call to the data API (the server bounds its reads by 30s).
const dataCallTimeout = 45 * time.Second

var (
	dataScheme = runtime.NewScheme()
	dataCodecs = serializer.NewCodecFactory(dataScheme)
	dataParams = runtime.NewParameterCodec(dataScheme)
)

func init() {
	if err := datav1alpha1.AddToScheme(dataScheme); err != nil {
		panic(err)
	}
	metav1.AddToGroupVersion(dataScheme, schema.GroupVersion{Version: "v1"})
}

// Data is a REST client of the data API from the kubeconfig flags.
func (o *Options) Data() (rest.Interface, error) {
	if o.data != nil {
		return o.data, nil
	}
	cfg, err := o.Kube.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "kubectl-webhooks/" + version.Version
	cfg.GroupVersion = &datav1alpha1.SchemeGroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = dataCodecs.WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to Kubernetes: %w", err)
	}
	o.data = rc
	return rc, nil
}

// dataList is one list call: the field selector's fields, a page size and a continue token.
type dataList struct {
	fields fields.Set
	limit  int
	cont   string
}

func (l dataList) options() *metav1.ListOptions {
	opts := &metav1.ListOptions{Limit: int64(l.limit), Continue: l.cont}
	if len(l.fields) > 0 {
		opts.FieldSelector = fields.SelectorFromSet(l.fields).String()
	}
	return opts
}

// listData lists resource in namespace ns into out.
func (o *Options) listData(ctx context.Context, ns, resource string, l dataList, out runtime.Object) error {
	rc, err := o.Data()
	if err != nil {
		return err
	}
	return rc.Get().Namespace(ns).Resource(resource).VersionedParams(l.options(), dataParams).
		Timeout(dataCallTimeout).Do(ctx).Into(out)
}

// getData reads one object of resource (or its subresource, when not empty) into out.
func (o *Options) getData(ctx context.Context, ns, resource, name, subresource string, out runtime.Object) error {
	rc, err := o.Data()
	if err != nil {
		return err
	}
	req := rc.Get().Namespace(ns).Resource(resource).Name(name).Timeout(dataCallTimeout)
	if subresource != "" {
		req = req.SubResource(subresource)
	}
	return req.Do(ctx).Into(out)
}

// dataError turns an error of the data API about what (a resource, or one object of it) into
// a clear error with its exit code: a 400 is a usage error, a 403 a refusal naming the RBAC it
// needs, a 404 of an object not found; the API itself missing or its server unavailable says
// which APIService to look at, and how.
func dataError(err error, verb, what, ns string) error {
	if err == nil {
		return nil
	}
	check := fmt.Sprintf("check it with `kubectl get apiservice %s` (its AVAILABLE column says why not) and see docs/deliveries-api.md#when-the-apiservice-is-unavailable", APIServiceName)
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return fmt.Errorf("reading %s through the data API (%s): %w", what, datav1alpha1.SchemeGroupVersion, err)
	}
	msg := status.Status().Message
	switch {
	case objectNotFound(err):
		return notFoundf("%s", msg)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("the data API %s is not served by this cluster: is webhook-operator's API server installed (chart value apiserver.enabled)? %s", datav1alpha1.SchemeGroupVersion, check)
	case apierrors.IsServiceUnavailable(err) && strings.Contains(msg, "NATS"):
		return fmt.Errorf("reading %s: the data API's server cannot reach NATS: %s", what, msg)
	case apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err) && strings.Contains(msg, "service unavailable"):
		return fmt.Errorf("reading %s: the data API's server is unavailable (APIService %s): %s; %s", what, APIServiceName, msg, check)
	case apierrors.IsBadRequest(err):
		return usagef("%s", msg)
	case apierrors.IsForbidden(err):
		return refusedf("%s; Kubernetes RBAC must allow %s on %s (%s) in namespace %s, e.g. the ClusterRole webhook-operator-%s", msg, verb,
			resourceOf(what), datav1alpha1.GroupName, ns, map[bool]string{true: "editor", false: "viewer"}[verb != "get/list"])
	}
	return fmt.Errorf("reading %s: %w", what, err)
}

// objectNotFound reports whether err is a 404 of one object (with its name), not of the API.
func objectNotFound(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &status) {
		return false
	}
	d := status.Status().Details
	return d != nil && d.Name != ""
}

// resourceOf is the resource a description of what names.
func resourceOf(what string) string {
	for _, r := range []string{datav1alpha1.ResourceDeadLetters + "/" + datav1alpha1.SubresourcePayload, datav1alpha1.ResourceDeadLetters, datav1alpha1.ResourceDeliveries} {
		if strings.Contains(what, r) {
			return r
		}
	}
	return what
}
