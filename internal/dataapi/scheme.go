package dataapi

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
)

var (
	// Scheme holds the API's kinds, as the server's handlers convert through them.
	Scheme = runtime.NewScheme()
	// Codecs serve the API.
	Codecs = serializer.NewCodecFactory(Scheme)
)

// withoutProtobuf offers the API's media types but protobuf: its kinds have no protobuf
// encoding. A client that asks for protobuf first (the namespace controller's metadata client,
// emptying a namespace being deleted) gets JSON, not an error that leaves the namespace
// Terminating.
type withoutProtobuf struct{ runtime.NegotiatedSerializer }

func (s withoutProtobuf) SupportedMediaTypes() []runtime.SerializerInfo {
	var out []runtime.SerializerInfo
	for _, info := range s.NegotiatedSerializer.SupportedMediaTypes() {
		if info.MediaType != runtime.ContentTypeProtobuf {
			out = append(out, info)
		}
	}
	return out
}

// selectable are the field selectors each kind answers.
var selectable = map[string][]string{
	"WebhookDelivery": {datav1alpha1.FieldName, datav1alpha1.FieldNamespace, datav1alpha1.FieldEndpoint, datav1alpha1.FieldState,
		datav1alpha1.FieldEventID, datav1alpha1.FieldEventType, datav1alpha1.FieldSince, datav1alpha1.FieldUntil, datav1alpha1.FieldView},
	"WebhookDeadLetter": {datav1alpha1.FieldName, datav1alpha1.FieldNamespace, datav1alpha1.FieldEndpoint, datav1alpha1.FieldReason,
		datav1alpha1.FieldUntil},
}

func init() {
	if err := datav1alpha1.AddToServerScheme(Scheme); err != nil {
		panic(err)
	}
	// The unversioned meta kinds (Status, WatchEvent, options) the handlers use.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	for kind, fields := range selectable {
		if err := Scheme.AddFieldLabelConversionFunc(datav1alpha1.SchemeGroupVersion.WithKind(kind), fieldLabels(kind, fields)); err != nil {
			panic(err)
		}
	}
}

// fieldLabels accepts the field selectors of kind and refuses others with the list of those
// it answers.
func fieldLabels(kind string, fields []string) runtime.FieldLabelConversionFunc {
	return func(label, value string) (string, string, error) {
		for _, f := range fields {
			if f == label {
				return label, value, nil
			}
		}
		return "", "", fmt.Errorf("field selector %q is not supported for %s: use %v", label, kind, fields)
	}
}
