//go:build race

package tokenchunk

// raceDetector: the race detector allocates where a plain build does not.
const raceDetector = true
