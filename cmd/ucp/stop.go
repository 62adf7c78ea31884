package main

import (
	"fmt"
	"os"
	"time"
)

// stopAfter is the kill -9 test's hook: when UCP_STOP_AFTER names the
// phase just finished, the process says so on stderr and waits there for
// the test to kill it.
func stopAfter(phase string) {
	if os.Getenv("UCP_PHASES") != "" {
		fmt.Fprintf(os.Stderr, "ucp: %s at %.3f s\n", phase, time.Since(processStart).Seconds())
	}
	if os.Getenv("UCP_STOP_AFTER") != phase {
		return
	}
	fmt.Fprintf(os.Stderr, "ucp: stopped after %s\n", phase)
	time.Sleep(time.Hour)
}

// processStart is when the process started, for UCP_PHASES.
var processStart = time.Now()
