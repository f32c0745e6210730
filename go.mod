module github.com/libasync/libasync

go 1.26.0

require golang.org/x/sys v0.49.0

require github.com/mattn/go-pointer v0.0.1
