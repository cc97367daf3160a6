//go:build tools

// Package tools pins the NSQ binaries that the tests and `make run` use.
// scripts/install-tools builds them into .tools/bin.
package tools

import (
	_ "github.com/nsqio/nsq/apps/nsq_tail"
	_ "github.com/nsqio/nsq/apps/nsqd"
	_ "github.com/nsqio/nsq/apps/nsqlookupd"
	_ "github.com/nsqio/nsq/apps/to_nsq"
	_ "github.com/nsqio/nsq/bench/bench_reader"
	_ "github.com/nsqio/nsq/bench/bench_writer"
)
