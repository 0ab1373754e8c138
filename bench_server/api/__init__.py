"""The REST API: dependencies (`deps`), the router that lists the resources (`router`) and one module per resource."""
