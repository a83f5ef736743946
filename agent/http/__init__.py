"""The HTTP surface: the FastAPI app, its routers, problem details and the metrics endpoint."""
