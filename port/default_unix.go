//go:build unix && !linux

package port

// defaultBackend on unix systems without a dedicated backend yet.
const defaultBackend = "poll"
