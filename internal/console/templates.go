package console

import (
	"fmt"
	"html/template"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pageNames are the pages, each templates/<name>.html within templates/layout.html.
var pageNames = []string{"signin", "error", "namespaces", "namespace", "endpoint", "delivery", "deadletters", "replay", "quota", "expressions", "deadletter"}

var funcs = template.FuncMap{
	"ago": func(t any) string {
		var at time.Time
		switch x := t.(type) {
		case metav1.Time:
			at = x.Time
		case *metav1.Time:
			if x == nil {
				return ""
			}
			at = x.Time
		case metav1.MicroTime:
			at = x.Time
		case time.Time:
			at = x
		}
		if at.IsZero() {
			return ""
		}
		return at.UTC().Format("2006-01-02 15:04:05Z")
	},
	"list": func(s ...string) []string { return s },
	"usms": func(us int64) string { return fmt.Sprintf("%.1f ms", float64(us)/1000) },
	"ms": func(us *int64) string {
		if us == nil {
			return ""
		}
		return fmt.Sprintf("%.1f ms", float64(*us)/1000)
	},
}

func parseTemplates() (map[string]*template.Template, error) {
	out := make(map[string]*template.Template, len(pageNames))
	for _, n := range pageNames {
		t, err := template.New(n).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/chart.html", "templates/"+n+".html")
		if err != nil {
			return nil, fmt.Errorf("console: page %s: %w", n, err)
		}
		out[n] = t
	}
	return out, nil
}
