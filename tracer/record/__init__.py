"""Recording: decorators, context, capture, the recorder and its encoder."""
