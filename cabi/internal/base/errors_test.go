package base

import (
	"os"
	"regexp"
	"testing"
)

// Every code of async.h's async_err_t is in codes with the same value, and
// async_strerror has a text for it (a code added to async.h without a text
// or a Go Code fails here; a value that differs does not compile).
func TestErrorTable(t *testing.T) {
	h, err := os.ReadFile("../../../include/async.h")
	if err != nil {
		t.Fatal(err)
	}
	decl := regexp.MustCompile(`(?m)^\s*(ASYNC_(?:OK|E_[A-Z]+)) = (\d+),?`).FindAllSubmatch(h, -1)
	if len(decl) == 0 {
		t.Fatal("no error codes found in async.h")
	}
	byName := map[string]int{}
	for _, c := range codes {
		byName[c.name] = int(c.c)
		if int(c.c) != int(c.g) {
			t.Errorf("%s: C %d, Go %d", c.name, c.c, c.g)
		}
		if s := strerror(int(c.c)); s == "" || s == "unknown error" {
			t.Errorf("%s has no text in errors.c", c.name)
		}
	}
	for _, d := range decl {
		name, val := string(d[1]), string(d[2])
		v, ok := byName[name]
		if !ok {
			t.Errorf("%s (async.h) is missing from codes (errors.go) and libasync's Codes", name)
			continue
		}
		if val != itoa(v) {
			t.Errorf("%s: async.h says %s, codes %d", name, val, v)
		}
	}
	if len(decl) != len(codes) {
		t.Errorf("async.h declares %d codes, errors.go lists %d", len(decl), len(codes))
	}
	if s := strerror(len(codes)); s != "unknown error" {
		t.Errorf("async_strerror(%d) = %q, want unknown error", len(codes), s)
	}
}

func itoa(v int) string {
	if v < 10 {
		return string(rune('0' + v))
	}
	return itoa(v/10) + string(rune('0'+v%10))
}
