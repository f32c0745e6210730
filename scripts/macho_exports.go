//go:build ignore

// macho_exports prints the symbols a Mach-O dylib exports (defined,
// external, not private-external), one per line: cross.sh checks darwin's
// libasync.dylib with it (go tool nm does not tell private externs apart).
//
//	go run scripts/macho_exports.go libasync.dylib
package main

import (
	"debug/macho"
	"fmt"
	"os"
)

const (
	nExt  = 0x01 // N_EXT
	nPext = 0x10 // N_PEXT
	nType = 0x0e // N_TYPE
	nSect = 0x0e // N_SECT: defined in a section
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: macho_exports <file.dylib>")
		os.Exit(2)
	}
	f, err := macho.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	if f.Symtab == nil {
		fmt.Fprintln(os.Stderr, "no symbol table")
		os.Exit(1)
	}
	for _, s := range f.Symtab.Syms {
		if s.Type&nType == nSect && s.Type&nExt != 0 && s.Type&nPext == 0 {
			fmt.Println(s.Name)
		}
	}
}
