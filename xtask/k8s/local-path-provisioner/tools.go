//go:build tools

// The package built from this module (the provisioner's main package is its module's root),
// imported so `go mod tidy` keeps what it needs.
package tools

import (
	_ "github.com/rancher/local-path-provisioner"
)
