// Package scheme holds the one Scheme every Kubernetes client of the operator uses, and the
// manifest decoder made from it.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// New returns a scheme with the built-in kinds and the webhook-operator.io API: the one
// every client of the operator's binaries, the local stack and the tests uses.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Decoder decodes YAML or JSON manifests of the kinds New knows into typed objects.
func Decoder() runtime.Decoder {
	return serializer.NewCodecFactory(New()).UniversalDeserializer()
}
