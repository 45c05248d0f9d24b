package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// StandInCRD stands in, in tests, for the CustomResourceDefinition of a kind another project
// owns (the Prometheus Operator's ServiceMonitor, KEDA's ScaledObject): namespaced, served and
// stored at gvk's version, validating objects with schema (nil: any object is accepted).
func StandInCRD(gvk schema.GroupVersionKind, schema *apiextensionsv1.JSONSchemaProps) *apiextensionsv1.CustomResourceDefinition {
	singular := strings.ToLower(gvk.Kind)
	plural := singular + "s"
	if schema == nil {
		preserve := true
		schema = &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: &preserve}
	}
	return &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: apiextensionsv1.SchemeGroupVersion.String(), Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + gvk.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: gvk.Group,
			Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: gvk.Kind, ListKind: gvk.Kind + "List", Plural: plural, Singular: singular},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: gvk.Version, Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: schema},
			}},
		},
	}
}

// InstallCRDs creates crds and waits until the API server serves them.
func (cp *ControlPlane) InstallCRDs(crds ...*apiextensionsv1.CustomResourceDefinition) error {
	_, err := envtest.InstallCRDs(cp.Config, envtest.CRDInstallOptions{CRDs: crds})
	return err
}

// ControllerUser is a user of the control plane bound to config/rbac/role.yaml (the
// controller's ClusterRole, generated from its RBAC markers) and nothing else, so that a
// controller running as it proves the generated RBAC is enough.
func (cp *ControlPlane) ControllerUser(ctx context.Context) (*envtest.AuthenticatedUser, error) {
	f, err := os.Open(filepath.Join(Root(), "config", "rbac", "role.yaml"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	role := &rbacv1.ClusterRole{}
	if err := yaml.NewYAMLOrJSONDecoder(f, 4096).Decode(role); err != nil {
		return nil, fmt.Errorf("config/rbac/role.yaml: %w", err)
	}
	if err := cp.Client.Create(ctx, role); err != nil {
		return nil, err
	}
	const user = "webhook-operator-controller"
	if err := cp.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}); err != nil {
		return nil, err
	}
	return cp.Env.AddUser(envtest.User{Name: user}, nil)
}
