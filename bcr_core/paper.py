"""The paper's constants, each with the place that states it. Every default in the package reads
them from here, so a reader checks the lab against the paper in one file.
"""

# Budgeted Cache Repair (§3, App. A.2, Algorithm 1)
DRAFT_TOKENS = 2  # k: one prompt-side and one answer-side query (App. A.2)
RHO = 0.20  # the share of cached rows repaired on a call (§3)
CHUNK_ROWS = 64  # B: rows per chunk of the chunk layout (App. B, Algorithm 1)
GROW_TAU = 0.25  # grow: a neighbour joins while it scores >= tau * its seed (§3)
GROW_SPAN_CAP = 64  # grow: the longest span (§3)

# KVComm's anchor pool and gate: the released repository's defaults (§3, §4)
GAMMA = 0.3  # Eq. 2: the fraction of the maximum entropy log2(n) the gate tolerates
MAX_ANCHORS = 20  # per placeholder
EVICTION_WINDOW = 5  # evict the least-activated of this many oldest anchors
TOP_P = 0.9  # anchors whose softmax weights make up this mass are combined

# Controls
OPENGATE_THETA = 0.5  # OpenGate accepts a draft whose mean top-1 probability reaches theta (App. I)
RANDOM_ALLOCATION_P = 0.25  # Random allocation gives up a reuse with this probability (App. A.1, Table 7)
