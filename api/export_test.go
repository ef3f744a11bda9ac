package api

// QueryParams is the table of the query parameters each route reads, for
// the test that holds it to openapi.yaml.
var QueryParams = queryParams
