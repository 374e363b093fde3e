"""`octlm serve`: a trained model behind an OpenAI-compatible HTTP API and a chat page
(docs/serve.md). Needs the `serve` extra (Starlette, uvicorn)."""
