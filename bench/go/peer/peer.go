// Package peer holds what the Go peers of the benchmark harness share: their
// argument parsing and their failure line.
package peer

import (
	"fmt"
	"os"
	"strconv"
)

// Arg returns the positive integer os.Args[i], or def when there are fewer
// arguments; anything else is a usage error (exit status 2).
func Arg(i, def int) int {
	if len(os.Args) <= i {
		return def
	}
	v, err := strconv.Atoi(os.Args[i])
	if err != nil || v <= 0 {
		fmt.Fprintln(os.Stderr, "bad argument:", os.Args[i])
		os.Exit(2)
	}
	return v
}

// Fail prints the failed-run line bench/run.sh reads (ok=0 and the error)
// and exits with status 1.
func Fail(format string, a ...any) {
	fmt.Printf("ok=0 error=\"%s\"\n", fmt.Sprintf(format, a...))
	os.Exit(1)
}
