//go:build tools

// Keeps CoreDNS's main package in this module's build list.
package tools

import _ "github.com/coredns/coredns/core/plugin"
