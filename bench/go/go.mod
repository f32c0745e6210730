// The Go parts of the benchmark harness: the Go peers (goroutines, channels,
// timers) and the report generator. A module of its own so that the
// library's `go build ./...` and `go test ./...` never see it.
module libasync/bench

go 1.22
