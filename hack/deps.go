//go:build tools

// Package hack pins modules the project uses in places `go mod tidy` cannot see yet, so that
// parallel work never has to edit go.mod.
package hack

import (
	_ "github.com/onsi/gomega"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/spf13/cobra"
	_ "github.com/standard-webhooks/standard-webhooks/libraries/go"
	_ "golang.org/x/time/rate"
	_ "gonum.org/v1/plot"
	_ "k8s.io/cli-runtime/pkg/genericclioptions"
	_ "sigs.k8s.io/controller-runtime"
	_ "sigs.k8s.io/controller-runtime/pkg/envtest"
)
