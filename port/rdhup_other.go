//go:build unix && !linux

package port

// pollRdHup: only Linux has POLLRDHUP; elsewhere POLLHUP is all there is.
const pollRdHup = 0
