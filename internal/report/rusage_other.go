//go:build !linux && !darwin

package report

// PeakRSS is unavailable here: the report leaves peak_rss_bytes out.
func PeakRSS() (int64, bool) { return 0, false }
