//go:build tools

// Package tools pins nats-server for scripts/install-tools.
package tools

import _ "github.com/nats-io/nats-server/v2"
