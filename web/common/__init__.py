"""The ground floor every feature stands on: error bodies, body parsing, CORS, chat templates,
the request and response shapes shared by the endpoints, and their validation."""
