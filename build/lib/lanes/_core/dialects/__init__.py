"""The other APIs clients speak — OpenAI's Responses, the Messages API — translated to and from
chat completions, the one protocol lanes sends upstream. Every module here is pure."""
