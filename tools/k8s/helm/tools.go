//go:build tools

// Package tools pins helm, which the deploy tests use to lint, render and
// install the chart. scripts/install-tools builds it into .tools/bin.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
