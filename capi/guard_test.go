package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A panic that escapes an export kills the host process, and a call into a
// poisoned library must fail fast: every Go export is one call of enter or
// enterNode, which defer the guard before anything else and check the poison
// next. This walks the source so a new export cannot skip them.
func TestEveryExportEntersThroughTheGuardedPreamble(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	exports := 0
	preambles := map[string]*ast.FuncDecl{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if fn.Recv == nil && (fn.Name.Name == "enter" || fn.Name.Name == "enterNode") {
				preambles[fn.Name.Name] = fn
			}
			if fn.Doc == nil || !hasExportDirective(fn.Doc) {
				continue
			}
			exports++
			body := fn.Body.List
			require.Len(t, body, 1, "%s: the body must be one return of enter(...) or enterNode(...)", fn.Name.Name)
			ret, ok := body[0].(*ast.ReturnStmt)
			require.True(t, ok && len(ret.Results) == 1, "%s: the body must be one return of enter(...) or enterNode(...)", fn.Name.Name)
			call, ok := ret.Results[0].(*ast.CallExpr)
			require.True(t, ok, "%s: must return enter(...) or enterNode(...)", fn.Name.Name)
			helper := exprName(call.Fun)
			require.Contains(t, []string{"enter", "enterNode"}, helper, "%s: must return enter(...) or enterNode(...)", fn.Name.Name)
			_, isLit := call.Args[len(call.Args)-1].(*ast.FuncLit)
			assert.True(t, isLit, "%s: the body is a func literal (it must not escape: no allocation per call)", fn.Name.Name)
			// The export's public name must match its C symbol.
			want := "peerkv_" + strings.TrimPrefix(fn.Name.Name, "pkvgo_")
			lit, ok := call.Args[0].(*ast.BasicLit)
			require.True(t, ok, "%s: the first argument is the C symbol's name", fn.Name.Name)
			assert.Equal(t, `"`+want+`"`, lit.Value, fn.Name.Name)
		}
	}
	// Every function of the header but peerkv_abi_version (pure C) is a Go export.
	header, err := os.ReadFile("../include/peerkv.h")
	require.NoError(t, err)
	declared := regexp.MustCompile(`(?m)^u?int32_t peerkv_\w+\(`).FindAll(header, -1)
	assert.Equal(t, len(declared)-1, exports, "exports found")

	// Both preambles: c := call{...}; defer c.guard(&rc); if rc = c.begin() ...
	for _, name := range []string{"enter", "enterNode"} {
		fn := preambles[name]
		require.NotNil(t, fn, "%s not found", name)
		body := fn.Body.List
		require.GreaterOrEqual(t, len(body), 3, name)
		assign, ok := body[0].(*ast.AssignStmt)
		require.True(t, ok, "%s: first statement must be c := call{...}", name)
		lit, ok := assign.Rhs[0].(*ast.CompositeLit)
		require.True(t, ok && exprName(lit.Type) == "call", "%s: first statement must be c := call{...}", name)
		def, ok := body[1].(*ast.DeferStmt)
		require.True(t, ok && exprName(def.Call.Fun) == "c.guard", "%s: second statement must be defer c.guard(&rc)", name)
		check, ok := body[2].(*ast.IfStmt)
		require.True(t, ok && check.Init != nil, "%s: third statement must be if rc = c.begin(); ...", name)
		begin, ok := check.Init.(*ast.AssignStmt)
		require.True(t, ok, "%s: third statement must be if rc = c.begin(); ...", name)
		beginCall, ok := begin.Rhs[0].(*ast.CallExpr)
		require.True(t, ok && exprName(beginCall.Fun) == "c.begin", "%s: third statement must be if rc = c.begin(); ...", name)
	}
}

func hasExportDirective(g *ast.CommentGroup) bool {
	for _, c := range g.List {
		if strings.HasPrefix(c.Text, "//export ") {
			return true
		}
	}
	return false
}

func exprName(e ast.Expr) string {
	switch v := e.(type) {
	case *ast.Ident:
		return v.Name
	case *ast.SelectorExpr:
		return exprName(v.X) + "." + v.Sel.Name
	}
	return ""
}

// Every function of the header has a C wrapper that refuses forked children
// before calling its Go export (peerkv_abi_version is a constant).
func TestEveryHeaderFunctionHasAForkGuardedWrapper(t *testing.T) {
	header, err := os.ReadFile("../include/peerkv.h")
	require.NoError(t, err)
	wrappers, err := os.ReadFile("wrappers.c")
	require.NoError(t, err)
	names := regexp.MustCompile(`\b(peerkv_[a-z_]+)\(`).FindAllStringSubmatch(string(header), -1)
	require.NotEmpty(t, names)
	for _, m := range names {
		name := m[1]
		body := regexp.MustCompile(`(?s)\b` + name + `\([^)]*\)\s*\{(.*?)\n\}`).FindStringSubmatch(string(wrappers))
		require.NotNil(t, body, "no wrapper for %s", name)
		if name == "peerkv_abi_version" {
			continue
		}
		assert.Contains(t, body[1], "REFUSE_FORKED", name)
		assert.Contains(t, body[1], "pkvgo_"+strings.TrimPrefix(name, "peerkv_")+"(", name)
		assert.Less(t, strings.Index(body[1], "REFUSE_FORKED"), strings.Index(body[1], "pkvgo_"), name)
	}
}
