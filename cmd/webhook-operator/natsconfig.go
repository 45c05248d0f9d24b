package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/bcrypt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

func init() { subcommands = append(subcommands, natsConfigCommand) }

// natsConfigCommand writes what an existing NATS and the chart need for the auth callout: new
// keys and passwords, the server's configuration (passwords as bcrypt hashes) and the
// controller's Secret.
func natsConfigCommand() *cobra.Command {
	var (
		outDir, namespace, secretName string
		names                         = streams.DefaultNames()
		tls                           natsauth.ServerTLS
		noXKey                        bool
		limits                        natsauth.Limits
		jsMaxStore, jsMaxMemory       int64
	)
	cmd := &cobra.Command{
		Use:   "nats-config --out-dir=<dir>",
		Short: "Write a nats-server configuration for the auth callout and the controller's Secret, with new keys",
		Long: `nats-config makes new keys and passwords and writes, into --out-dir:

  webhook-operator-auth.conf  accounts, users and the auth callout; include it in the
                              nats-server configuration (passwords are bcrypt hashes).
                              Tenant connections' limits (--nats-user-*) must be the
                              controller's: pass it the same flags (chart:
                              nats.auth.callout.userLimits)
  callout-secret.yaml         the Secret the chart's controller reads (nats.auth.callout.existingSecret):
                              the callout's seeds and the two logins' passwords

Nothing secret is printed. Keep callout-secret.yaml out of version control: apply it and delete it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if outDir == "" {
				return fmt.Errorf("--out-dir is required")
			}
			k, err := natsauth.GenerateKeys()
			if err != nil {
				return err
			}
			adminHash, err := bcrypt.GenerateFromPassword([]byte(k.AdminPassword), bcrypt.DefaultCost)
			if err != nil {
				return err
			}
			calloutHash, err := bcrypt.GenerateFromPassword([]byte(k.CalloutPassword), bcrypt.DefaultCost)
			if err != nil {
				return err
			}
			conf := natsauth.ServerConfig{
				AdminUser: natsauth.DefaultAdminUser, AdminPassword: string(adminHash),
				CalloutUser: natsauth.DefaultCalloutUser, CalloutPassword: string(calloutHash),
				Issuer: k.Issuer, XKey: k.XKey,
				EventsSubjectPrefix: names.EventsSubjectPrefix, InternalSubjectPrefix: names.InternalPrefix,
				TenantLimits: limits, JetStreamMaxStore: jsMaxStore, JetStreamMaxMemory: jsMaxMemory,
			}
			data := map[string]string{
				"issuer.seed": string(k.IssuerSeed), "xkey.seed": string(k.XKeySeed),
				"admin-user": natsauth.DefaultAdminUser, "admin-password": k.AdminPassword,
				"callout-user": natsauth.DefaultCalloutUser, "callout-password": k.CalloutPassword,
			}
			if noXKey {
				conf.XKey = ""
				delete(data, "xkey.seed")
			}
			if tls.CertFile != "" {
				tls.Verify = true
				conf.TLS = &tls
			}
			secret := &corev1.Secret{
				TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
				ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: namespace},
				Type:       corev1.SecretTypeOpaque, StringData: data,
			}
			b, err := yaml.Marshal(secret)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(outDir, 0o700); err != nil {
				return err
			}
			confFile, secretFile := filepath.Join(outDir, "webhook-operator-auth.conf"), filepath.Join(outDir, "callout-secret.yaml")
			if err := os.WriteFile(confFile, []byte(conf.Render()), 0o600); err != nil {
				return err
			}
			if err := os.WriteFile(secretFile, b, 0o600); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (include it in nats-server's configuration)\nwrote %s (kubectl apply -f it, then delete it)\nauth callout issuer: %s\n",
				confFile, secretFile, k.Issuer)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&outDir, "out-dir", "", "directory to write the two files into")
	fs.StringVar(&namespace, "namespace", "webhook-operator-system", "namespace of the chart's release (the Secret's)")
	fs.StringVar(&secretName, "secret-name", "webhook-operator-nats-callout", "name of the Secret (nats.auth.callout.existingSecret)")
	fs.StringVar(&names.EventsSubjectPrefix, "events-subject-prefix", names.EventsSubjectPrefix, "first token of event subjects (streams.eventsSubjectPrefix)")
	fs.StringVar(&names.InternalPrefix, "internal-subject-prefix", names.InternalPrefix, "first token of the operator's subjects (streams.internalSubjectPrefix)")
	fs.StringVar(&tls.CertFile, "server-cert-file", "", "the NATS server's certificate, as a path on the server: turns on TLS with client certificates")
	fs.StringVar(&tls.KeyFile, "server-key-file", "", "the NATS server's key, as a path on the server")
	fs.StringVar(&tls.CAFile, "server-ca-file", "", "the CA the clients' certificates chain to, as a path on the server")
	addLimitFlags(fs, &limits)
	opconfig.BytesVar(fs, &jsMaxStore, "jetstream-max-store", "bound of the file storage of the account holding every namespace's streams (0: the server's own); streams with a size bound reserve it")
	opconfig.BytesVar(fs, &jsMaxMemory, "jetstream-max-memory", "bound of the memory storage of that account (0: the server's own)")
	fs.BoolVar(&noXKey, "no-xkey", false, "do not encrypt authorization requests (they carry Kubernetes tokens; keep encryption unless the server is older than 2.10)")
	return cmd
}
