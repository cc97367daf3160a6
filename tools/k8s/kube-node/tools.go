//go:build tools

// Package tools pins what runs a real one-node cluster next to kube-apiserver
// (nsqworker.testing.kube_cluster): the kubelet, kube-controller-manager,
// kube-scheduler and kubectl, all from k8s.io/kubernetes v1.34.4 like
// tools/k8s/kube-apiserver. scripts/install-tools builds them into .tools/bin.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
