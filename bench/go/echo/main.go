// TCP echo server, Go peer: net.Listen on 127.0.0.1:0, one goroutine per
// connection reading into a 4 KiB buffer and writing it back (Go sets
// TCP_NODELAY by default). Prints "port=N" and serves until killed.
//
// usage: echo [procs]   (GOMAXPROCS; default: Go's own)
package main

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
)

func main() {
	if len(os.Args) > 1 {
		p, err := strconv.Atoi(os.Args[1])
		if err != nil || p <= 0 {
			fmt.Fprintln(os.Stderr, "bad argument:", os.Args[1])
			os.Exit(2)
		}
		runtime.GOMAXPROCS(p)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
	fmt.Printf("port=%d\n", ln.Addr().(*net.TCPAddr).Port)
	for {
		c, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "echo: accept:", err)
			continue
		}
		go func(c net.Conn) {
			defer c.Close()
			buf := make([]byte, 4096)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}(c)
	}
}
