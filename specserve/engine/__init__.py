"""The engine: lossless speculative decoding on one loaded model (models are loaded by
`specserve.models`): draft trees and proposers, target forwards, verification, the decode loop,
continuous batching, LoRA rows, and the choices measured per device (compile, dtype, draft sizes)."""
