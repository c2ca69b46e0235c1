package bench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestTargetValidate(t *testing.T) {
	tests := []struct {
		target  Target
		wantErr string
	}{
		{Target{Name: "ok", BaseURL: "http://127.0.0.1:8080/v1", Model: "m"}, ""},
		{Target{Name: "nomodel", BaseURL: "http://127.0.0.1:8080/v1"}, "no model name"},
		{Target{Name: "noscheme", BaseURL: "127.0.0.1:8080/v1", Model: "m"}, "not an http(s) URL"},
		{Target{Name: "nohost", BaseURL: "http:///v1", Model: "m"}, "not an http(s) URL"},
	}
	for _, tt := range tests {
		err := tt.target.Validate()
		if (tt.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: err = %v, want %q", tt.target.Name, err, tt.wantErr)
		}
	}
	if got := (Target{BaseURL: "http://h/v1/"}).ChatURL(); got != "http://h/v1/chat/completions" {
		t.Errorf("ChatURL = %s", got)
	}
}

func TestRecordingClient(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, `{"raw":true}`)
	}))
	defer srv.Close()
	client := Target{BaseURL: srv.URL}.RecordingClient()
	capture := &Capture{}
	req, _ := http.NewRequestWithContext(WithCapture(context.Background(), capture), http.MethodGet, srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != `{"raw":true}` || string(capture.Body()) != string(body) || capture.Status() != http.StatusTeapot {
		t.Errorf("client read %q, capture holds %q with status %d", body, capture.Body(), capture.Status())
	}
	// A request without a capture is not recorded anywhere.
	req2, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	resp, err = client.Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(capture.Body()) != len(body) {
		t.Error("an uncaptured request was recorded")
	}
}
