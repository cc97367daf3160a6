//go:build tools

// Package tools pins etcd, the store behind the kube-apiserver that the
// deploy tests start. scripts/install-tools builds the module's root package
// (its main) into .tools/bin/etcd.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
