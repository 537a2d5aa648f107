"""Every pool setting in words: the label the settings form shows, and the help under it.

The key names (poolLocalAffinity ...) are the API's and the CLI's; a person reading the form
gets a sentence. tests/test_pool_charts.py holds this mapping to PoolSettings: a setting
added without words fails there, so the form never falls back to a bare key.
"""

from __future__ import annotations

#: key -> (label, help)
SETTING_WORDS: dict[str, tuple[str, str]] = {
    "poolEnabled": (
        "Hub Pool on",
        "The master switch. Off: this node neither sends work to its peers nor serves theirs, and pairing "
        "waits until it is on again."),
    "poolOutboundEnabled": (
        "Send work to other Hubs",
        "Off: requests made here are served only by this node's engines; a model only a peer holds fails "
        "here instead of being sent out."),
    "poolInboundEnabled": (
        "Serve work from other Hubs",
        "Off: peers see this node as healthy but accepting no work, and route elsewhere. This node keeps "
        "using them."),
    "poolLocalAffinity": (
        "Head start for this node (queued requests)",
        "How many more requests this node may have queued before an idler peer takes the next one. A turn "
        "served here reuses the prompt the engine already holds; on a peer it starts cold."),
    "poolHealthPollSeconds": (
        "Check on peers every (seconds)",
        "How often this node asks each paired Hub for its health, engines and models."),
    "poolPins": (
        "Pins",
        "Nodes put first for a model or for every model; edited in the Pins section above."),
    "poolRequireSignedPeers": (
        "Accept only signed peer requests",
        "Refuse the older bearer-token path in both directions. Turn on only once every peer has finished "
        "the upgrade to signed requests, or those pairings stop working both ways."),
    "poolShareContainerStats": (
        "Share container totals with peers",
        "Tell paired Hubs how many containers run here and what they use in total; never a container's "
        "name. Off: peers read it as not reported, never as idle."),
    "poolPressureWeight": (
        "Weight of GPU pressure in ranking",
        "How much a node's GPU busyness, from outside the pool, counts against it. 0 ignores it; 1 makes "
        "each band worth one queued request."),
    "poolMaxPromptTokens": (
        "Largest prompt to serve for the pool (tokens)",
        "Prompts estimated above this go to another node when one can take them. Empty: no ceiling."),
    "poolProbeSnapshotTtlMs": (
        "Reuse an engine health check for (ms)",
        "How long a local engine's last health answer is trusted for placement before a fresh probe. 0 "
        "checks every engine live on every request."),
    "poolPrefixAffinityMaxInFlight": (
        "Keep a conversation on its engine up to (queued requests)",
        "The node and engine that served a conversation's last turn are tried first while their queue is "
        "below this. 0 turns it off."),
    "poolPrefixAffinityMargin": (
        "Extra queue allowed to keep a conversation (requests)",
        "Past that limit, still keep the conversation where it was while its queue is at most this much "
        "deeper than the least loaded other node. Only widens a limit that is on."),
    "poolSlotAwareness": (
        "Skip engines whose stated slots are full",
        "1: an engine whose queue already fills the parallel slots its node stated goes behind every one "
        "with a free slot. 0 keeps slot counts out of ranking."),
    "poolSessionSources": (
        "Where a conversation's id is read from",
        "Header or body fields that name a conversation, first match wins; used to keep a conversation on "
        "its engine."),
    "poolEngineQueueDepth": (
        "Count work the engine reports itself",
        "1: add what a local engine says it is running or holding beyond this node's own requests to its "
        "queue depth (for engines that report it). 0 counts this node's requests alone."),
    "poolTtftRanking": (
        "Rank by predicted time to first token",
        "1: order the nodes with measured speeds by when each would start answering (queue, prompt "
        "processing, model load). 0 ranks by queue depth alone."),
    "poolPrefixIndex": (
        "Know which engine holds a shared prompt",
        "1: with time-to-first-token ranking, count the prompt beginning each engine already holds (a "
        "long system prompt many conversations share) wherever this node sent it. 0 counts only the "
        "engine that last took the conversation."),
    "poolSessionSpread": (
        "Spread conversations across equal nodes",
        "1: when several nodes would start answering at about the same time, the one holding the fewest "
        "conversations takes a new one. 0 leaves such ties to queue depth."),
    "poolLoadPollMs": (
        "Learn busy peers' load this often (ms)",
        "While this node is busy, it asks each peer how many requests it has in flight this often, "
        "instead of waiting for the next health poll. 0 turns it off."),
    "poolAdmissionQueue": (
        "Requests that may wait for a free node",
        "When every node is busy, up to this many requests wait here for the first free one instead of "
        "queuing at an engine. 0 turns the waiting line off."),
    "poolAdmissionTargetMs": (
        "Waiting requests aim to start answering within (ms)",
        "While requests wait for a free node, the ones that can still start answering within this time go "
        "before the ones that already cannot, so a burst serves as many in time as the pool can. 0 keeps "
        "arrival order."),
    "poolAdmissionBatchKeys": (
        "Batch keys (wait behind interactive work)",
        "Inference keys whose waiting requests go behind every interactive one."),
    "poolRouteAppsAlways": (
        "Send apps through the pool even with no peer",
        "Off: while no peer is connected, the client handout points apps straight at this node's engines."),
    "poolStreamFirstToken": (
        "Hold a stream until its first real token",
        "1: an answer reaches the app only once its engine sends real content, so an engine that sends "
        "headers and then nothing is passed over within the first-byte deadline. 0 commits at the headers."),
    "poolStreamKeepAliveMs": (
        "Keep a waiting agent stream alive every (ms)",
        "A streamed agent or chat request with no answer yet gets its headers after this long and a "
        "keep-alive at this cadence, so the client's idle timeout does not cut a long prompt. 0 is off."),
    "poolStreamStallMs": (
        "End a stream silent mid-answer after (ms)",
        "An answer that has started and then sends nothing new for this long is ended with the app's "
        "error event and counted against its engine. 0 waits forever."),
    "poolStreamLoopGuard": (
        "End an answer that loops",
        "1: an answer whose text repeats one passage back to back (600 characters, four times or more) is "
        "ended and counted against its engine. 0 lets it run."),
    "poolStreamResume": (
        "Resume a cut answer on another node",
        "1: an answer cut mid-way (its node gone, stalled or looping) is continued by the next node from "
        "where it stopped, in the same stream. 0 never moves an answer that has started."),
    "maxNumCtx": (
        "Context window cap (tokens)",
        "The largest context window this node runs a model at; larger requests are sent to a node without "
        "that cap when one can serve them. Empty: no cap."),
    "ollamaSlots": (
        "Parallel requests the engine runs (stated)",
        "How many requests this node's engine generates at once, as you configured it (its own setting for "
        "parallel requests); used by slot-aware placement. Empty: not stated."),
    "inferenceModel": (
        "Model for \u201cauto\u201d",
        "The model a request for auto gets, wherever in the pool it is served. Empty: none chosen."),
    "poolModelAliases": (
        "Model aliases (name or pattern = model)",
        "A model name no Hub serves, or a pattern such as claude-*, and the model it runs on instead "
        "(or auto). One per line. Claude Code's background model is a claude-… name."),
    "pluginsDisabled": (
        "Plugins switched off",
        "Plugins by name that this node does not load; takes effect at the next start."),
}
