//go:build tools

// The packages built from this module, imported so `go mod tidy` keeps what they need.
package tools

import (
	_ "k8s.io/kubernetes/test/images/nonewprivs"
	_ "k8s.io/kubernetes/test/images/regression-issue-74839"
	_ "k8s.io/kubernetes/test/images/resource-consumer"
	_ "k8s.io/kubernetes/test/images/resource-consumer/consume-cpu"
	_ "k8s.io/sample-apiserver"
)
