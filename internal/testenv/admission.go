package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/scheme"
)

// What config/admission/policy.yaml names that an installation changes: the controller's
// ServiceAccount (as a user name) and the image of its dispatchers.
const (
	AdmissionPolicyUser  = "system:serviceaccount:webhook-operator-system:webhook-operator-controller"
	AdmissionPolicyImage = "ghcr.io/webhook-operator/webhook-operator:latest"
)

// AdmissionPolicy is config/admission/policy.yaml (the ValidatingAdmissionPolicy and its
// binding) for a controller acting as user whose dispatchers run image, as the chart renders
// it for its release.
func AdmissionPolicy(user, image string) ([]byte, error) {
	path := filepath.Join(Root(), "config", "admission", "policy.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	text := string(b)
	for _, r := range [][2]string{{"'" + AdmissionPolicyUser + "'", "'" + user + "'"}, {"'" + AdmissionPolicyImage + "'", "'" + image + "'"}} {
		if !strings.Contains(text, r[0]) {
			return nil, fmt.Errorf("%s no longer names %s", path, r[0])
		}
		text = strings.ReplaceAll(text, r[0], r[1])
	}
	return []byte(text), nil
}

// InstallAdmissionPolicy creates config/admission's policy for a controller acting as user
// (with the client configuration as) whose dispatchers run image (see AdmissionPolicy), and
// waits until the API server enforces it: a dry-run create of an unlabelled ConfigMap in
// namespace ns, as the controller, is refused.
func (cp *ControlPlane) InstallAdmissionPolicy(ctx context.Context, as *rest.Config, user, image, ns string) error {
	text, err := AdmissionPolicy(user, image)
	if err != nil {
		return err
	}
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(text)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		obj, _, err := scheme.Decoder().Decode(doc, nil, nil)
		if err != nil {
			return fmt.Errorf("config/admission/policy.yaml: %w", err)
		}
		if err := cp.Client.Create(ctx, obj.(client.Object)); err != nil {
			return fmt.Errorf("config/admission/policy.yaml: %w", err)
		}
	}
	c, err := client.New(as, client.Options{Scheme: scheme.New()})
	if err != nil {
		return err
	}
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unlabelled"}}
	err = Poll(30*time.Second, func() error {
		err := c.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "may only create or update objects labelled") {
			return nil
		}
		return fmt.Errorf("an unlabelled ConfigMap: %v", err)
	})
	if err != nil {
		return fmt.Errorf("the admission policy did not refuse an unlabelled ConfigMap: %w", err)
	}
	return nil
}
