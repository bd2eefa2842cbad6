//go:build tools

package tools

import _ "github.com/elastic/crd-ref-docs"
