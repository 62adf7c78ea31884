//go:build darwin

package report

import "syscall"

// PeakRSS returns the process's peak resident set size in bytes, and false
// where the system does not say.
func PeakRSS() (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return ru.Maxrss, true // macOS counts bytes
}
