package api

import _ "embed"

// OpenAPI is the API's OpenAPI 3 document, served at /openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte
