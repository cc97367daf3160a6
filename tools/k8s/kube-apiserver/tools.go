//go:build tools

// Package tools pins kube-apiserver, which the deploy tests start (with etcd)
// as a real control plane. scripts/install-tools builds it into .tools/bin.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
