// The sources, stages, evidence and usage of one answer in Hayhooks' embedded Chainlit chat UI.
// Props (injected by Chainlit, not passed as arguments): haystack_fusion.serving.presentation.evidence_element_props.
import { Card, CardHeader, CardTitle, CardContent } from "@/components/ui/card";
import { Badge } from "@/components/ui/badge";

export default function FusionEvidence() {
  const { summary = "", sources = [], stages = [], evidence = "", usage = "" } = props;
  return (
    <Card className="w-full my-2">
      <CardHeader className="pb-2">
        <CardTitle className="text-base">{summary}</CardTitle>
      </CardHeader>
      <CardContent className="flex flex-col gap-3 text-sm">
        <div className="flex flex-col gap-2">
          {sources.map((source) => (
            <div key={source.index} className="flex flex-col gap-1">
              <div className="flex flex-wrap items-center gap-2">
                <span className="font-semibold">
                  [{source.index}] {source.title}
                </span>
                {source.supporting ? (
                  <Badge>supported the answer</Badge>
                ) : (
                  <Badge variant="outline">retrieved</Badge>
                )}
                {source.score === null ? null : (
                  <span className="text-muted-foreground">score {source.score}</span>
                )}
              </div>
              <div className="text-muted-foreground">{source.excerpt}</div>
            </div>
          ))}
        </div>
        {stages.length ? (
          <div>
            <span className="font-semibold">Stages: </span>
            {stages.join(" → ")}
          </div>
        ) : null}
        {evidence ? (
          <div>
            <span className="font-semibold">Evidence: </span>
            {evidence}
          </div>
        ) : null}
        <div className="text-muted-foreground">{usage}</div>
      </CardContent>
    </Card>
  );
}
