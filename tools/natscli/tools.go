//go:build tools

// Package tools pins the nats CLI (natscli) for scripts/install-tools.
package tools

import _ "github.com/nats-io/natscli/nats"
