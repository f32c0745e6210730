//go:build ignore

// macho_exports lists, or cuts down, what a Mach-O dylib exports. cross.sh
// uses it on darwin's libasync.dylib, linked by zig 0.11, whose linker takes
// no -exported_symbols_list (the counterpart of cabi/exports.map): without
// this step the dylib also exports the C subsystems' la_* functions, cgo's
// glue and zig's compiler-rt.
//
//	go run scripts/macho_exports.go libasync.dylib
//	    prints the exported names (without the leading '_'), one per line:
//	    the export trie's (what dyld binds to and dlsym finds), after
//	    checking that the symbol table's external definitions say the same.
//	go run scripts/macho_exports.go -keep 'async_*' libasync.dylib
//	    rewrites the dylib in place so that it exports only the names listed
//	    (comma-separated, without '_'; "name*" stands for every name that
//	    starts with name, as in cabi/exports.map), what ld64's
//	    -exported_symbols_list does:
//	    a new export trie with only those entries (each entry's flags and
//	    address copied); the symbol table's other external definitions made
//	    what ld64 makes of a hidden symbol (N_PEXT, no N_EXT); an ad-hoc code
//	    signature's page hashes recomputed. The code is untouched: the
//	    linker resolved the dylib's references to its own symbols already
//	    (the tool refuses a dylib with weak definitions or weak binds, where
//	    dyld would look a removed name up at load time).
package main

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

const (
	mhMagic64        = 0xfeedfacf
	mhDylib          = 6
	mhWeakDefines    = 0x8000
	mhBindsToWeak    = 0x10000
	lcSymtab         = 0x2
	lcDysymtab       = 0xb
	lcCodeSignature  = 0x1d
	lcDyldInfo       = 0x22
	lcDyldInfoOnly   = 0x80000022
	lcDyldExportTrie = 0x80000033

	nExt  = 0x01
	nPext = 0x10
	nType = 0x0e
	nSect = 0x0e
	nStab = 0xe0

	csMagicEmbeddedSignature = 0xfade0cc0
	csMagicCodeDirectory     = 0xfade0c02
)

var le = binary.LittleEndian
var be = binary.BigEndian

type image struct {
	b                    []byte
	symoff, nsyms        uint32
	stroff               uint32
	exportOff, exportLen uint32
	weakBindLen          uint32
	sigOff, sigLen       uint32
	flags                uint32
}

func parse(b []byte) (*image, error) {
	if len(b) < 32 || le.Uint32(b) != mhMagic64 {
		return nil, errors.New("not a 64-bit little-endian Mach-O file")
	}
	im := &image{b: b, flags: le.Uint32(b[24:])}
	if le.Uint32(b[12:]) != mhDylib {
		return nil, errors.New("not a dylib")
	}
	ncmds, off := le.Uint32(b[16:]), uint32(32)
	trie := false
	for i := uint32(0); i < ncmds; i++ {
		if int(off)+8 > len(b) {
			return nil, errors.New("truncated load commands")
		}
		cmd, size := le.Uint32(b[off:]), le.Uint32(b[off+4:])
		c := b[off:]
		switch cmd {
		case lcSymtab:
			im.symoff, im.nsyms, im.stroff = le.Uint32(c[8:]), le.Uint32(c[12:]), le.Uint32(c[16:])
		case lcDyldInfo, lcDyldInfoOnly:
			im.weakBindLen = le.Uint32(c[28:])
			im.exportOff, im.exportLen = le.Uint32(c[40:]), le.Uint32(c[44:])
			trie = true
		case lcDyldExportTrie:
			im.exportOff, im.exportLen = le.Uint32(c[8:]), le.Uint32(c[12:])
			trie = true
		case lcCodeSignature:
			im.sigOff, im.sigLen = le.Uint32(c[8:]), le.Uint32(c[12:])
		}
		off += size
	}
	if !trie {
		return nil, errors.New("no export trie (LC_DYLD_INFO or LC_DYLD_EXPORTS_TRIE)")
	}
	if im.symoff == 0 {
		return nil, errors.New("no LC_SYMTAB")
	}
	return im, nil
}

func uleb(b []byte, p int) (uint64, int, error) {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if p >= len(b) || shift > 63 {
			return 0, 0, errors.New("bad uleb128 in the export trie")
		}
		c := b[p]
		p++
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, p, nil
		}
	}
}

func putUleb(out []byte, v uint64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			out = append(out, c|0x80)
		} else {
			return append(out, c)
		}
	}
}

// exports walks the export trie: name (with '_') -> the terminal's payload
// (flags, address, ...), copied as it is.
func (im *image) exports() (map[string][]byte, error) {
	t := im.b[im.exportOff : im.exportOff+im.exportLen]
	out := map[string][]byte{}
	seen := map[int]bool{}
	var walk func(p int, prefix string) error
	walk = func(p int, prefix string) error {
		if p >= len(t) || seen[p] {
			return errors.New("bad node offset in the export trie")
		}
		seen[p] = true
		n, q, err := uleb(t, p)
		if err != nil {
			return err
		}
		if n > 0 {
			if q+int(n) > len(t) {
				return errors.New("bad terminal size in the export trie")
			}
			out[prefix] = append([]byte(nil), t[q:q+int(n)]...)
		}
		q += int(n)
		if q >= len(t) {
			return errors.New("truncated export trie")
		}
		kids := int(t[q])
		q++
		for i := 0; i < kids; i++ {
			e := bytes.IndexByte(t[q:], 0)
			if e < 0 {
				return errors.New("bad edge label in the export trie")
			}
			label := string(t[q : q+e])
			q += e + 1
			var child uint64
			child, q, err = uleb(t, q)
			if err != nil {
				return err
			}
			if err := walk(int(child), prefix+label); err != nil {
				return err
			}
		}
		return nil
	}
	if len(t) == 0 {
		return out, nil
	}
	return out, walk(0, "")
}

type node struct {
	term  []byte // nil: not a terminal
	edges []edge
	off   int
}

type edge struct {
	label string
	child *node
}

// buildTrie makes a compact trie (edges carry the longest shared prefixes)
// of the entries, laid out the way ld64 does: offsets are ULEB128, so the
// layout is repeated until no node moves.
func buildTrie(entries map[string][]byte) []byte {
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var build func(names []string, depth int) *node
	build = func(names []string, depth int) *node {
		nd := &node{}
		i := 0
		if i < len(names) && len(names[i]) == depth {
			nd.term = entries[names[i]]
			i++
		}
		for i < len(names) {
			c := names[i][depth]
			j := i
			for j < len(names) && names[j][depth] == c {
				j++
			}
			group := names[i:j]
			// the edge: the longest prefix the group shares beyond depth
			// (it ends where a name of the group ends)
			l := depth + 1
			for ext := true; ext; {
				ext = len(group[0]) > l
				for _, n := range group[1:] {
					if !ext {
						break
					}
					ext = len(n) > l && n[l] == group[0][l]
				}
				if ext {
					l++
				}
			}
			nd.edges = append(nd.edges, edge{group[0][depth:l], build(group, l)})
			i = j
		}
		return nd
	}
	root := build(names, 0)
	var order []*node
	var visit func(n *node)
	visit = func(n *node) {
		order = append(order, n)
		for _, e := range n.edges {
			visit(e.child)
		}
	}
	visit(root)
	size := func(n *node) int {
		s := 1 // child count
		if n.term != nil {
			s += len(putUleb(nil, uint64(len(n.term)))) + len(n.term)
		} else {
			s++ // terminal size 0
		}
		for _, e := range n.edges {
			s += len(e.label) + 1 + len(putUleb(nil, uint64(e.child.off)))
		}
		return s
	}
	for moved := true; moved; {
		moved = false
		off := 0
		for _, n := range order {
			if n.off != off {
				n.off, moved = off, true
			}
			off += size(n)
		}
	}
	var out []byte
	for _, n := range order {
		if n.term != nil {
			out = putUleb(out, uint64(len(n.term)))
			out = append(out, n.term...)
		} else {
			out = append(out, 0)
		}
		out = append(out, byte(len(n.edges)))
		for _, e := range n.edges {
			out = append(out, e.label...)
			out = append(out, 0)
			out = putUleb(out, uint64(e.child.off))
		}
	}
	return out
}

func cstr(b []byte, p uint32) string {
	if int(p) >= len(b) {
		return ""
	}
	e := bytes.IndexByte(b[p:], 0)
	if e < 0 {
		return string(b[p:])
	}
	return string(b[p : int(p)+e])
}

// symbols calls fn with each defined external symbol of the symbol table,
// private externs (N_PEXT) included (its name with '_' and the offset of
// its n_type byte).
func (im *image) symbols(fn func(name string, typeOff int)) {
	for i := uint32(0); i < im.nsyms; i++ {
		p := int(im.symoff + 16*i)
		typ := im.b[p+4]
		if typ&nStab == 0 && typ&nType == nSect && typ&nExt != 0 {
			fn(cstr(im.b, im.stroff+le.Uint32(im.b[p:])), p+4)
		}
	}
}

// resign recomputes the page hashes of every code directory of an embedded
// signature (the ad-hoc one zig's linker writes for arm64).
func (im *image) resign() error {
	if im.sigLen == 0 {
		return nil
	}
	s := im.b[im.sigOff : im.sigOff+im.sigLen]
	if be.Uint32(s) != csMagicEmbeddedSignature {
		return errors.New("unknown code signature blob")
	}
	count := be.Uint32(s[8:])
	for i := uint32(0); i < count; i++ {
		off := be.Uint32(s[12+8*i+4:])
		cd := s[off:]
		if be.Uint32(cd) != csMagicCodeDirectory {
			continue
		}
		hashOff := be.Uint32(cd[16:])
		nCode := be.Uint32(cd[28:])
		codeLimit := be.Uint32(cd[32:])
		hashSize, hashType, pageShift := int(cd[36]), cd[37], cd[39]
		if codeLimit > im.sigOff {
			return errors.New("the code signature covers itself")
		}
		page := uint32(1) << pageShift
		for k := uint32(0); k < nCode; k++ {
			lo, hi := k*page, (k+1)*page
			if hi > codeLimit {
				hi = codeLimit
			}
			var h []byte
			switch hashType {
			case 1:
				x := sha1.Sum(im.b[lo:hi])
				h = x[:]
			case 2, 3:
				x := sha256.Sum256(im.b[lo:hi])
				h = x[:]
			default:
				return fmt.Errorf("code directory hash type %d", hashType)
			}
			copy(cd[int(hashOff)+int(k)*hashSize:int(hashOff)+int(k+1)*hashSize], h[:hashSize])
		}
	}
	return nil
}

func die(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "macho_exports: "+f+"\n", a...)
	os.Exit(1)
}

func main() {
	keep := flag.String("keep", "", "rewrite the dylib to export only these names (comma-separated, name* for a prefix)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: macho_exports [-keep name,prefix*,...] <file.dylib>")
		os.Exit(2)
	}
	path := flag.Arg(0)
	b, err := os.ReadFile(path)
	if err != nil {
		die("%v", err)
	}
	im, err := parse(b)
	if err != nil {
		die("%s: %v", path, err)
	}
	exp, err := im.exports()
	if err != nil {
		die("%s: %v", path, err)
	}
	if *keep == "" {
		// The export trie and the symbol table must agree (for the
		// external symbols that are private, too: zig's linker exports
		// them).
		syms := map[string]bool{}
		im.symbols(func(name string, _ int) { syms[name] = true })
		var names []string
		for n := range exp {
			names = append(names, strings.TrimPrefix(n, "_"))
			if !syms[n] {
				die("%s: %s is in the export trie but no external symbol", path, n)
			}
		}
		for n := range syms {
			if _, ok := exp[n]; !ok {
				die("%s: %s is an external symbol but not in the export trie", path, n)
			}
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Println(n)
		}
		return
	}

	exact := map[string]bool{}
	var prefixes []string
	for _, l := range strings.Split(*keep, ",") {
		if p, ok := strings.CutSuffix(l, "*"); ok {
			prefixes = append(prefixes, "_"+p)
		} else {
			exact["_"+l] = true
		}
	}
	want := func(name string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		return exact[name]
	}
	if im.flags&(mhWeakDefines|mhBindsToWeak) != 0 || im.weakBindLen != 0 {
		die("%s: has weak definitions or weak binds: dyld could look up a removed name", path)
	}
	kept := map[string][]byte{}
	for n, payload := range exp {
		if want(n) {
			kept[n] = payload
		}
	}
	trie := buildTrie(kept)
	if len(trie) > int(im.exportLen) {
		die("%s: the new export trie (%d bytes) is larger than the old (%d)", path, len(trie), im.exportLen)
	}
	region := b[im.exportOff : im.exportOff+im.exportLen]
	copy(region, trie)
	clear(region[len(trie):]) // the size stays: dyld walks from the root only
	hidden := 0
	im.symbols(func(name string, typeOff int) {
		if !want(name) {
			// what ld64 writes for a private extern: not external any more
			b[typeOff] = b[typeOff]&^nExt | nPext
			hidden++
		}
	})
	if err := im.resign(); err != nil {
		die("%s: %v", path, err)
	}
	// Check the result with the reader above before writing it.
	if got, err := im.exports(); err != nil || len(got) != len(kept) {
		die("%s: the rewritten export trie does not read back (%v)", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		die("%v", err)
	}
	if err := os.WriteFile(path+".tmp", b, st.Mode()); err != nil {
		die("%v", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		die("%v", err)
	}
	fmt.Printf("%s: %d exports kept, %d removed (%d symbols made local)\n",
		path, len(kept), len(exp)-len(kept), hidden)
}
