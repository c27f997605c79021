"""The engine: CTranslate2 in a process of its own, the scheduler that batches jobs onto it,
and what they share (``request``: what a caller asks for; ``engine``: the client that runs
batches in the engine process; ``scheduler``: the lanes).
"""
