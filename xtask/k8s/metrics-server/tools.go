//go:build tools

// The package built from this module, imported so `go mod tidy` keeps what it needs.
package tools

import (
	_ "sigs.k8s.io/metrics-server/cmd/metrics-server"
)
