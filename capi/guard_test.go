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

// Every Go export must start with newCall + defer guard, or a panic in it
// would kill the host process. This walks the source so a new export cannot
// forget it.
func TestEveryExportDefersTheGuardFirst(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	exports := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Doc == nil || !hasExportDirective(fn.Doc) {
				continue
			}
			exports++
			body := fn.Body.List
			require.GreaterOrEqual(t, len(body), 2, fn.Name.Name)
			assign, ok := body[0].(*ast.AssignStmt)
			require.True(t, ok, "%s: first statement must be c := newCall(...)", fn.Name.Name)
			call, ok := assign.Rhs[0].(*ast.CallExpr)
			require.True(t, ok && exprName(call.Fun) == "newCall", "%s: first statement must call newCall", fn.Name.Name)
			def, ok := body[1].(*ast.DeferStmt)
			require.True(t, ok && exprName(def.Call.Fun) == "c.guard", "%s: second statement must be defer c.guard(&rc)", fn.Name.Name)
			// The export's public name must match its C symbol.
			want := "peerkv_" + strings.TrimPrefix(fn.Name.Name, "pkvgo_")
			assert.Equal(t, `"`+want+`"`, call.Args[0].(*ast.BasicLit).Value, fn.Name.Name)
		}
	}
	// Every function of the header but peerkv_abi_version (pure C) is a Go export.
	header, err := os.ReadFile("../include/peerkv.h")
	require.NoError(t, err)
	declared := regexp.MustCompile(`(?m)^u?int32_t peerkv_\w+\(`).FindAll(header, -1)
	assert.Equal(t, len(declared)-1, exports, "exports found")
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
