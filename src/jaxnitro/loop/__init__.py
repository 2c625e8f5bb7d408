"""The loops: automatic training, and validate/evaluate/predict."""
