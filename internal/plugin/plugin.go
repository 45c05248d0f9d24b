// Package plugin implements `kubectl webhooks`, the kubectl plugin of webhook-operator: publish
// a test event, send a one-shot test delivery to one endpoint, show endpoint health, read the
// delivery log, list, show and purge dead letters, replay them, re-enable an auto-disabled
// endpoint, and evaluate filters and transformations on a sample event.
//
// Every command runs in-process through Run, so tests drive the real commands with arguments
// and read their output and exit code. Kubernetes is reached with the standard kubeconfig
// flags (k8s.io/cli-runtime): WebhookEndpoints, and the data API (data.webhook-operator.io,
// dataapi.go) through which every reading command (log, dlq list and show, test --wait) reads
// and dlq purge deletes, with the user's own RBAC and no NATS connection. Only publish and
// test write to NATS, reached with the operator's own flags (internal/opconfig), the NATS_*
// environment, or the operator's Secret.
//
// Tables print what receivers and producers wrote (bodies, errors, headers, payloads, event
// ids and types) through one escaping (escape, applied by row, writeLine and writeBlock), so no
// control character reaches a terminal; JSON and YAML output hold the text exactly.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/version"
)

// Exit codes of kubectl-webhooks.
const (
	// ExitOK: the command did what was asked.
	ExitOK = 0
	// ExitError: something failed (connection, server, unexpected data).
	ExitError = 1
	// ExitUsage: wrong arguments or flags.
	ExitUsage = 2
	// ExitRefused: the request is valid but refused, e.g. a replay to a disabled endpoint.
	ExitRefused = 3
	// ExitNotFound: the endpoint, dead letter or cursor does not exist.
	ExitNotFound = 4
)

// Error is an error with the exit code it gives.
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func usagef(format string, a ...any) error {
	return &Error{Code: ExitUsage, Err: fmt.Errorf(format, a...)}
}

func refusedf(format string, a ...any) error {
	return &Error{Code: ExitRefused, Err: fmt.Errorf(format, a...)}
}

func notFoundf(format string, a ...any) error {
	return &Error{Code: ExitNotFound, Err: fmt.Errorf(format, a...)}
}

// ExitCode is the exit code of err: an *Error's code, ExitOK for nil, ExitError otherwise.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ExitError
}

// Output formats.
const (
	OutputTable = "table"
	OutputJSON  = "json"
	OutputYAML  = "yaml"
)

// Defaults of the operator's installation the plugin looks for.
const (
	// DefaultOperatorNamespace is where the Helm chart installs the operator.
	DefaultOperatorNamespace = "webhook-operator-system"
	// NATSSecretName is the operator's Secret describing its NATS connection (keys url and,
	// optionally, creds, user, password, token, ca.crt).
	NATSSecretName = "webhook-operator-nats"
)

// Environment variables read for the NATS connection when --nats-url is not given.
const (
	EnvNATSURL   = "NATS_URL"
	EnvNATSCreds = "NATS_CREDS"
)

// natsFlags are the opconfig flags the plugin takes: connection and names, nothing that only
// the controller or dispatchers use.
var natsFlags = []string{
	"nats-url", "nats-creds-file", "nats-ca-file", "nats-cert-file", "nats-key-file", "nats-token-file",
	opconfig.FlagAllowPlaintextTokens, opconfig.FlagAllowAPIAudienceTokens,
	"events-stream", "events-subject-prefix", "deliveries-stream", "attempts-stream",
	"dead-letter-stream", "kv-bucket", "internal-subject-prefix", "replay-key-ttl",
}

// Options are what every command shares: streams, flags and the connections made from them.
type Options struct {
	IO   genericiooptions.IOStreams
	Kube *genericclioptions.ConfigFlags
	// NATS holds the connection flags and stream names, bound with opconfig's own flags.
	NATS opconfig.Config
	// OperatorNamespace holds the operator's NATS Secret.
	OperatorNamespace string
	// Output is table, json or yaml.
	Output string
	// Now is the clock (tests may fix it).
	Now func() time.Time
	// Getenv reads the environment (tests may replace it).
	Getenv func(string) string

	flags   *pflag.FlagSet
	ran     bool
	kube    client.Client
	data    rest.Interface
	nc      *nats.Conn
	js      jetstream.JetStream
	natsSrc string
}

// Run runs kubectl-webhooks with args and returns its exit code. Errors are printed on
// io.ErrOut.
func Run(ctx context.Context, args []string, io genericiooptions.IOStreams, getenv func(string) string) int {
	root, o := NewRootCommand(io)
	if getenv != nil {
		o.Getenv = getenv
	}
	defer o.Close()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	code := ExitCode(err)
	if !o.ran && code == ExitError {
		// Cobra failed before any command ran: arguments or flags are wrong.
		code = ExitUsage
	}
	// An error may hold several lines (errors.Join); each is escaped.
	writeBlock(io.ErrOut, "", "error: "+err.Error())
	if code == ExitUsage && cmd != nil {
		writeLine(io.ErrOut, "See '%s --help' for usage.", cmd.CommandPath())
	}
	return code
}

// NewRootCommand builds the command tree around fresh Options.
func NewRootCommand(io genericiooptions.IOStreams) (*cobra.Command, *Options) {
	o := &Options{
		IO:                io,
		Kube:              genericclioptions.NewConfigFlags(true),
		NATS:              opconfig.Default(),
		OperatorNamespace: DefaultOperatorNamespace,
		Output:            OutputTable,
		Now:               time.Now,
		Getenv:            os.Getenv,
	}
	root := &cobra.Command{
		Use:   "kubectl-webhooks",
		Short: "Publish test events, read delivery logs, replay dead letters and re-enable webhook endpoints",
		Long: `kubectl webhooks works with webhook-operator's WebhookEndpoints and the NATS JetStream
streams behind them.

What it reads (log, dlq list and show, status, test --wait) and dlq purge go through the
Kubernetes API alone: the endpoints, and the data API data.webhook-operator.io (deliveries
and dead letters, served by webhook-operator's API server behind the APIService
` + "v1alpha1.data.webhook-operator.io" + `), with your kubeconfig and its RBAC. Only publish and test
write to NATS.

NATS is reached with --nats-url (and --nats-ca-file, --nats-cert-file/--nats-key-file), else
the NATS_URL environment variable, else the operator's Secret webhook-operator-nats in
--operator-namespace.

You connect as yourself: a token of the NATS audience (--nats-token-file, or one requested
for your kubeconfig's ServiceAccount) goes to the operator's auth callout over TLS with the
namespace (-n), and Kubernetes RBAC decides what you may do there. Your kubeconfig's
own API-server token is sent only with --nats-allow-api-audience-tokens, and a token over a
connection without TLS only with --nats-allow-plaintext-tokens. NATS
credentials (--nats-creds-file, NATS_CREDS, NATS_USER/NATS_PASSWORD, NATS_TOKEN) are used
as they are, for installations without the auth callout.

Exit codes: 0 ok, 1 error, 2 usage, 3 refused, 4 not found.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl webhooks"},
		CompletionOptions: cobra.CompletionOptions{
			DisableDefaultCmd: true,
		},
	}
	root.SetIn(io.In)
	root.SetOut(io.Out)
	root.SetErr(io.ErrOut)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &Error{Code: ExitUsage, Err: err} })

	pf := root.PersistentFlags()
	o.flags = pf
	o.Kube.AddFlags(pf)
	all := pflag.NewFlagSet("opconfig", pflag.ContinueOnError)
	// No default URL: without --nats-url the environment or the operator's Secret says.
	o.NATS.NATS.URL = ""
	o.NATS.AddFlags(all)
	for _, name := range natsFlags {
		pf.AddFlag(all.Lookup(name))
	}
	pf.StringVar(&o.OperatorNamespace, "operator-namespace", o.OperatorNamespace,
		"namespace of the operator's Secret "+NATSSecretName+", read for the NATS connection when neither --nats-url nor NATS_URL is set")
	pf.StringVarP(&o.Output, "output", "o", o.Output, "output format: table, json or yaml")

	root.AddCommand(
		newPublishCommand(o),
		newStatusCommand(o),
		newLogCommand(o),
		newDLQCommand(o),
		newReplayCommand(o),
		newRecoverCommand(o),
		newTestCommand(o),
		newEnableCommand(o),
		newEvalCommand(o),
		&cobra.Command{
			Use:   "version",
			Short: "Print the plugin's version",
			Args:  cobra.NoArgs,
			RunE: o.run(func(context.Context, []string) error {
				_, err := fmt.Fprintln(o.IO.Out, version.Version)
				return err
			}),
		},
	)
	return root, o
}

// run wraps a command's body: it marks that a command ran (so later errors are not usage
// errors) and checks the shared flags first.
func (o *Options) run(f func(ctx context.Context, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		o.ran = true
		switch o.Output {
		case OutputTable, OutputJSON, OutputYAML:
		case "":
			o.Output = OutputTable
		default:
			return usagef("--output must be table, json or yaml, not %q", o.Output)
		}
		return f(cmd.Context(), args)
	}
}

// Close closes the connections the commands opened.
func (o *Options) Close() {
	if o.nc != nil {
		o.nc.Close()
		o.nc = nil
	}
}

// Namespace is the namespace of -n, else the kubeconfig context's, else default.
func (o *Options) Namespace() (string, error) {
	ns, _, err := o.Kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("reading the namespace from the kubeconfig: %w", err)
	}
	return ns, nil
}

// Client is a Kubernetes client from the kubeconfig flags.
func (o *Options) Client() (client.Client, error) {
	if o.kube != nil {
		return o.kube, nil
	}
	cfg, err := o.Kube.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-webhooks/" + version.Version
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, fmt.Errorf("connecting to Kubernetes: %w", err)
	}
	o.kube = c
	return c, nil
}

// Set is namespace ns's streams and bucket, with the names in force (defaults, or the name
// flags).
func (o *Options) Set(ns string) streams.Set { return o.NATS.Streams.For(ns) }

// GetEndpoint reads one WebhookEndpoint; a missing one (or a missing API) is ExitNotFound.
func (o *Options) GetEndpoint(ctx context.Context, namespace, name string) (*v1alpha1.WebhookEndpoint, error) {
	c, err := o.Client()
	if err != nil {
		return nil, err
	}
	ep := &v1alpha1.WebhookEndpoint{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, ep); err != nil {
		return nil, kubeError(err, "webhookendpoint %q in namespace %q", name, namespace)
	}
	return ep, nil
}

// kubeError turns a Kubernetes error about what into a clear error with its exit code.
func kubeError(err error, what string, a ...any) error {
	subject := fmt.Sprintf(what, a...)
	switch {
	case apierrors.IsNotFound(err):
		return notFoundf("%s not found", subject)
	case meta.IsNoMatchError(err):
		return notFoundf("the WebhookEndpoint API (webhook-operator.io/v1alpha1) is not installed in this cluster: install webhook-operator first")
	default:
		return fmt.Errorf("reading %s: %w", subject, err)
	}
}
