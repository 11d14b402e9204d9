//go:build tools

// Package tools names the commands this module pins, so that 'go mod tidy' keeps their
// dependencies.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/kind"
)
